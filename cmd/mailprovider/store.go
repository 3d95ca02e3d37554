package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"time"
)

// logFileName is the append-only JSON-lines file, in the data directory,
// that holds one record per message sent.
const logFileName = "keys.jsonl"

// record is one line of the log: an idempotency key, the identity of the
// body it was first used with, the response given then, and the message
// that was sent. Key and message are in one record so that they are made
// durable together.
type record struct {
	Key        string `json:"key"`
	BodySHA256 string `json:"body_sha256"`
	Status     int    `json:"status"`
	// Response is the exact response body, kept as a string so that a
	// replay is byte-for-byte the first answer.
	Response string      `json:"response"`
	Message  sentMessage `json:"message"`
}

// sentMessage is an entry of the sent log as /_admin/messages shows it.
type sentMessage struct {
	ID             string    `json:"id"`
	IdempotencyKey string    `json:"idempotency_key"`
	BodySHA256     string    `json:"body_sha256"`
	To             string    `json:"to"`
	Subject        string    `json:"subject"`
	SentAt         time.Time `json:"sent_at"`
}

func (r *record) validate() error {
	switch {
	case r.Key == "":
		return errors.New("record has no key")
	case r.BodySHA256 == "":
		return errors.New("record has no body hash")
	case r.Status < 100 || r.Status > 599:
		return fmt.Errorf("record has status %d", r.Status)
	case r.Message.ID == "":
		return errors.New("record has no message id")
	}
	return nil
}

// store is the durable key table and sent log. Every append is written and
// fsynced before it becomes visible (and so before any response mentions it).
type store struct {
	mu     sync.RWMutex
	f      *os.File
	size   int64 // bytes of valid records in f
	broken error // set when the file could not be restored after a failed write
	keys   map[string]*record
	sent   []sentMessage
}

// openStore opens (creating it if needed) the log in dir, takes an exclusive
// lock on it so two processes cannot share a data directory, and loads it.
// A torn last line (a crash in the middle of a write) is dropped; a bad line
// anywhere else is an error.
func openStore(dir string) (*store, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("create data dir: %w", err)
	}
	path := filepath.Join(dir, logFileName)
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("open key table: %w", err)
	}
	if err := lockFile(f); err != nil {
		f.Close()
		return nil, fmt.Errorf("data dir %s: %w", dir, err)
	}
	s := &store{f: f, keys: make(map[string]*record)}
	if err := s.load(); err != nil {
		f.Close()
		return nil, fmt.Errorf("load %s: %w", path, err)
	}
	// Make the file's directory entry durable too (it may have just been created).
	if err := syncDir(dir); err != nil {
		f.Close()
		return nil, err
	}
	return s, nil
}

func (s *store) load() error {
	if _, err := s.f.Seek(0, io.SeekStart); err != nil {
		return err
	}
	r := bufio.NewReader(s.f)
	var off int64
	lineNo := 0
	for {
		line, err := r.ReadBytes('\n')
		if len(line) == 0 && err == io.EOF {
			break
		}
		if err != nil && err != io.EOF {
			return err
		}
		lineNo++
		complete := err == nil // ends with '\n'
		var rec record
		perr := json.Unmarshal(bytes.TrimSpace(line), &rec)
		if perr == nil {
			perr = rec.validate()
		}
		if perr != nil || !complete {
			// Only the last line may be torn; anything after it means corruption.
			if _, peekErr := r.Peek(1); peekErr != io.EOF {
				return fmt.Errorf("line %d is corrupt: %v", lineNo, perr)
			}
			if perr == nil {
				// A whole record whose newline did not make it: keep it, finish the line.
				s.add(&rec)
				off += int64(len(line))
				if _, err := s.f.Write([]byte("\n")); err != nil {
					return err
				}
				off++
			}
			// Drop the torn tail so that the next append starts on a clean line.
			if err := s.f.Truncate(off); err != nil {
				return fmt.Errorf("drop torn last line: %w", err)
			}
			if err := s.f.Sync(); err != nil {
				return err
			}
			break
		}
		s.add(&rec)
		off += int64(len(line))
	}
	s.size = off
	return nil
}

// add indexes rec in memory. The first record of a key wins (there should
// never be two; the per-key lock prevents it).
func (s *store) add(rec *record) {
	if _, ok := s.keys[rec.Key]; ok {
		return
	}
	s.keys[rec.Key] = rec
	s.sent = append(s.sent, rec.Message)
}

// lookup returns the record of key, if any.
func (s *store) lookup(key string) (*record, bool) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	rec, ok := s.keys[key]
	return rec, ok
}

// append writes rec durably (write + fsync) and then makes it visible.
// On failure nothing is visible and the file is cut back to its last
// valid record.
func (s *store) append(rec *record) error {
	line, err := json.Marshal(rec)
	if err != nil {
		return err
	}
	line = append(line, '\n')

	s.mu.Lock()
	defer s.mu.Unlock()
	if s.broken != nil {
		return s.broken
	}
	if s.f == nil {
		return errors.New("store is closed")
	}
	if _, ok := s.keys[rec.Key]; ok {
		return fmt.Errorf("key %s is already recorded", rec.Key)
	}
	_, werr := s.f.Write(line)
	if werr == nil {
		werr = s.f.Sync()
	}
	if werr != nil {
		if terr := s.f.Truncate(s.size); terr != nil {
			s.broken = fmt.Errorf("key table unusable after a failed write (%v) and a failed repair: %w", werr, terr)
		}
		return fmt.Errorf("write key table: %w", werr)
	}
	s.size += int64(len(line))
	s.add(rec)
	return nil
}

// messages returns a copy of the sent log, in send order.
func (s *store) messages() []sentMessage {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return append([]sentMessage(nil), s.sent...)
}

// count returns the number of messages sent (= keys recorded).
func (s *store) count() int {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return len(s.sent)
}

// close releases the file and its lock. It is safe to call more than once.
func (s *store) close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.f == nil {
		return nil
	}
	err := s.f.Close()
	s.f = nil
	return err
}

// syncDir fsyncs a directory so that a file created in it survives a crash.
func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	// Some file systems cannot fsync a directory (EINVAL); that is no error.
	if err := d.Sync(); err != nil && !errors.Is(err, os.ErrInvalid) && !errors.Is(err, syscall.EINVAL) {
		return fmt.Errorf("sync data dir: %w", err)
	}
	return nil
}
