package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"
)

// The payment provider is a fake with the real one's idempotency
// semantics, run as a process of its own (this test binary, re-executed
// with fakeProviderEnv set), as the real provider is:
//
//   - POST /v1/refunds with an Idempotency-Key performs the refund and
//     answers {"id": "re_N", "status": "succeeded"};
//   - the same key again answers the first answer and performs nothing;
//   - the same key with another body is refused (422), as is no key (400);
//   - GET /v1/refunds lists every refund performed, in order.
const fakeProviderEnv = "REFUNDS_FAKE_PROVIDER"

func TestMain(m *testing.M) {
	if os.Getenv(fakeProviderEnv) == "1" {
		serveFakeProvider()
		return
	}
	os.Exit(m.Run())
}

// performed is one refund the provider performed.
type performed struct {
	ID          string `json:"id"`
	Key         string `json:"key"`
	PaymentID   string `json:"payment_id"`
	AmountCents int64  `json:"amount_cents"`
	Currency    string `json:"currency"`
}

// serveFakeProvider listens on a free port, prints its URL on stdout and
// serves until killed.
func serveFakeProvider() {
	var (
		mu     sync.Mutex
		bodies = map[string]string{}
		first  = map[string][]byte{}
		done   []performed
	)
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/refunds", func(w http.ResponseWriter, r *http.Request) {
		key := r.Header.Get("Idempotency-Key")
		body, err := io.ReadAll(r.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		if key == "" {
			http.Error(w, "Idempotency-Key is required", http.StatusBadRequest)
			return
		}
		mu.Lock()
		defer mu.Unlock()
		if prev, ok := bodies[key]; ok {
			if prev != string(body) {
				http.Error(w, "Idempotency-Key reused with another request", http.StatusUnprocessableEntity)
				return
			}
			w.Header().Set("Idempotent-Replayed", "true")
			_, _ = w.Write(first[key])
			return
		}
		var req performed
		if err := json.Unmarshal(body, &req); err != nil || req.PaymentID == "" || req.AmountCents <= 0 {
			http.Error(w, "a refund needs payment_id and a positive amount_cents", http.StatusBadRequest)
			return
		}
		req.ID, req.Key = fmt.Sprintf("re_%d", len(done)+1), key
		done = append(done, req)
		answer, _ := json.Marshal(map[string]string{"id": req.ID, "status": "succeeded"})
		bodies[key], first[key] = string(body), answer
		_, _ = w.Write(answer)
	})
	mux.HandleFunc("GET /v1/refunds", func(w http.ResponseWriter, _ *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		_ = json.NewEncoder(w).Encode(append([]performed{}, done...))
	})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	fmt.Printf("listening on http://%s\n", ln.Addr())
	fmt.Fprintln(os.Stderr, http.Serve(ln, mux))
	os.Exit(1)
}

// provider is a running fake provider process.
type provider struct {
	URL string
	cmd *exec.Cmd
}

// startProvider starts a fresh provider process, stopped when tb ends.
func startProvider(tb testing.TB) *provider {
	tb.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), fakeProviderEnv+"=1")
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		tb.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	line, err := bufio.NewReader(out).ReadString('\n')
	url, ok := strings.CutPrefix(strings.TrimSpace(line), "listening on ")
	if err != nil || !ok {
		tb.Fatalf("fake provider did not start: %q %v", line, err)
	}
	return &provider{URL: url, cmd: cmd}
}

// refunds lists the refunds the provider performed.
func (p *provider) refunds(ctx context.Context) ([]performed, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, p.URL+"/v1/refunds", nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	var out []performed
	return out, json.NewDecoder(resp.Body).Decode(&out)
}
