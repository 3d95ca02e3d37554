package pluginhost

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// NamePlaceholder in Config.User stands for the plugin's name: with
// "usher-p-{name}" every plugin runs as an OS user of its own, so it cannot
// signal, ptrace or read the /proc files of another plugin or of the host
// (DefaultUserPattern, created by UserAdd).
const NamePlaceholder = "{name}"

// DefaultUserPattern is the OS user `host setup-users` creates for each
// plugin and `--plugin-user` names them by.
const DefaultUserPattern = "usher-p-" + NamePlaceholder

// UserFor is the OS user pattern names for plugin: pattern with
// NamePlaceholder replaced, or pattern itself (one user for every plugin).
func UserFor(pattern, plugin string) string {
	return strings.ReplaceAll(pattern, NamePlaceholder, plugin)
}

// osUser is the OS user the plugin cfg starts runs as: User with
// NamePlaceholder replaced by the plugin's name, which is the manifest's
// (Name) or, for a binary started with no manifest, its file name.
func (cfg Config) osUser() string {
	if !strings.Contains(cfg.User, NamePlaceholder) {
		return cfg.User
	}
	name := cfg.Name
	if name == "" {
		name = filepath.Base(cfg.Path)
	}
	return UserFor(cfg.User, name)
}

// credential is the uid and gid of the OS user name, with no supplementary
// group, and its home directory.
func credential(name string) (*syscall.Credential, string, error) {
	u, err := user.Lookup(name)
	if err != nil {
		return nil, "", fmt.Errorf("plugin user: %w (create it: host setup-users)", err)
	}
	uid, err1 := strconv.ParseUint(u.Uid, 10, 32)
	gid, err2 := strconv.ParseUint(u.Gid, 10, 32)
	if err1 != nil || err2 != nil {
		return nil, "", fmt.Errorf("plugin user %s: uid %q, gid %q are not numbers", name, u.Uid, u.Gid)
	}
	if uid == 0 {
		return nil, "", fmt.Errorf("plugin user %s is root; a plugin never runs as root", name)
	}
	if os.Geteuid() != 0 && uint64(os.Geteuid()) != uid {
		return nil, "", fmt.Errorf("plugin user %s: the host runs as uid %d and only root can start a process as another user", name, os.Geteuid())
	}
	return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid), Groups: []uint32{}}, u.HomeDir, nil
}

// UserAdd creates name as a system user with a group of its own, no home
// directory and no login shell, for a plugin to run as; created is false
// when the user exists already. It runs useradd, so the host must be root.
func UserAdd(name string) (created bool, err error) {
	if _, err := user.Lookup(name); err == nil {
		return false, nil
	} else if !errors.As(err, new(user.UnknownUserError)) {
		return false, fmt.Errorf("plugin user %s: %w", name, err)
	}
	if err := shadowTool("useradd", "--system", "--user-group", "--no-create-home", "--home-dir", "/nonexistent",
		"--shell", "/usr/sbin/nologin", "--comment", "usher plugin", name); err != nil {
		return false, err
	}
	return true, nil
}

// UserDel deletes the OS user name and its group (what UserAdd created).
func UserDel(name string) error { return shadowTool("userdel", name) }

// shadowTool runs useradd or userdel, again while another one holds the
// lock on /etc/passwd or /etc/group (two hosts set up at once, parallel
// tests): they refuse at once rather than wait.
func shadowTool(tool string, args ...string) error {
	for wait := 10 * time.Millisecond; ; wait *= 2 {
		out, err := exec.Command(tool, args...).CombinedOutput()
		if err == nil {
			return nil
		}
		if !strings.Contains(string(out), "cannot lock") || wait > 2*time.Second {
			return fmt.Errorf("%s %s: %w: %s", tool, strings.Join(args, " "), err, strings.TrimSpace(string(out)))
		}
		time.Sleep(wait)
	}
}
