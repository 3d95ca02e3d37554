package hosttest

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"testing"

	"github.com/jackc/pgx/v5"
)

// A killed test binary's databases are dropped by the next binary's sweep;
// a live process's, and another machine's, are left alone.
func TestSweepDropsOnlyWhatDeadProcessesLeft(t *testing.T) {
	ctx := context.Background()
	// A pid that was a process of this machine and is no more.
	gone := exec.Command("true")
	if err := gone.Run(); err != nil {
		t.Fatal(err)
	}
	deadPID := gone.Process.Pid
	if !processGone(deadPID) {
		t.Skipf("pid %d was taken again at once", deadPID)
	}
	host, _ := os.Hostname()
	admin := adminConn(t)
	defer admin.Close(ctx)
	made := map[string]string{
		"dead":  fmt.Sprintf("%s%d on %s", madeByPrefix, deadPID, host),
		"live":  madeBy(),
		"other": fmt.Sprintf("%s%d on %s", madeByPrefix, deadPID, host+"-elsewhere"),
	}
	names := map[string]string{}
	for which, by := range made {
		name := DatabasePrefix + "sweep_" + which + "_" + Suffix()
		names[which] = name
		if _, err := admin.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { dropDatabase(name) })
		if _, err := admin.Exec(ctx, "COMMENT ON DATABASE "+pgx.Identifier{name}.Sanitize()+" IS "+quoteLiteral(by)); err != nil {
			t.Fatal(err)
		}
	}

	sweepOrphans()

	for which, want := range map[string]bool{"dead": false, "live": true, "other": true} {
		var exists bool
		if err := admin.QueryRow(ctx, `SELECT EXISTS (SELECT FROM pg_database WHERE datname = $1)`, names[which]).Scan(&exists); err != nil {
			t.Fatal(err)
		}
		if exists != want {
			t.Errorf("%s's database %s: exists %v after the sweep, want %v", which, names[which], exists, want)
		}
	}
}
