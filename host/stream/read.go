package stream

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/usherhq/usher/internal/entry"
)

// KeptBytes and keptElems bound what crosses the wire of an entry over
// entry.MaxBytes: the first KeptBytes of each of its first keptElems field
// names and values (so at most 128 KiB), enough to tell in its dead letter
// what it was.
const (
	KeptBytes = 2048
	keptElems = 64
)

// readScript wraps XREADGROUP (ARGV[1] "read") or XAUTOCLAIM ("claim") so
// that an oversized entry never crosses the wire: Redis measures each
// entry (a string's length is O(1) in Lua), and one over ARGV[5] bytes is
// replaced by the prefixes of its elements plus their full lengths. Without
// it one XREADGROUP COUNT 16 of 16 MiB entries is 256 MiB the client reads
// and parses before the host could check a size, whatever its budget says.
//
// The cost: Redis refuses BLOCK in a script, so the consumer polls (see
// ConsumerConfig.IdlePoll) instead of blocking in XREADGROUP. An empty
// read is one cheap EVALSHA; a busy consumer never waits.
//
// A third mode, "own", takes a new delivery of one entry (ARGV[9]) this
// consumer still owns: XCLAIM to itself, which counts the delivery and
// resets its idle time so no other host's reclaimer takes it meanwhile.
// Its cursor slot carries the entry's delivery count; an empty reply when
// the entry is no longer pending here (acked, or taken by another host).
//
// "read" takes the bands of one shard (KEYS, BandKeys: one hash slot),
// highest priority first: up to ARGV[4] entries in all, from the first
// band that has any, then the next. A job of a higher priority is read
// before any of a lower one, whatever waits in the lower band; the other
// modes take one key.
//
// The reply is {next cursor, {{id, fields, size, lens, key}...}}: size is
// the entry's full size, lens the full lengths of the kept elements when
// it was cut (empty when not), key the index in KEYS it was read from. XAUTOCLAIM before Redis 7 returns deleted entries
// with nil fields; they come back with no fields.
var readScript = redis.NewScript(`
local entries, nextid, from = {}, '', {}
if ARGV[1] == 'read' then
  local want = tonumber(ARGV[4])
  for k = 1, #KEYS do
    local r = redis.call('XREADGROUP', 'GROUP', ARGV[2], ARGV[3], 'COUNT', want - #entries, 'STREAMS', KEYS[k], '>')
    if r then
      for _, e in ipairs(r[1][2]) do
        entries[#entries + 1] = e
        from[#entries] = k
      end
      if #entries >= want then break end
    end
  end
elseif ARGV[1] == 'own' then
  local p = redis.call('XPENDING', KEYS[1], ARGV[2], ARGV[9], ARGV[9], 1)
  if #p == 0 or p[1][2] ~= ARGV[3] then return {'', {}} end
  entries = redis.call('XCLAIM', KEYS[1], ARGV[2], ARGV[3], 0, ARGV[9])
  if #entries == 0 or not entries[1][2] then return {'', {}} end
  nextid = tostring(p[1][4] + 1)
else
  local r = redis.call('XAUTOCLAIM', KEYS[1], ARGV[2], ARGV[3], ARGV[8], ARGV[9], 'COUNT', ARGV[4])
  entries, nextid = r[2], r[1]
end
local limit, keep, maxe = tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7])
local out = {}
for i, e in ipairs(entries) do
  local f = e[2] or {}
  local size = 0
  for j = 1, #f do size = size + #f[j] end
  local lens = {}
  if size > limit then
    local kept = {}
    for j = 1, math.min(#f, maxe) do
      lens[j] = #f[j]
      kept[j] = string.sub(f[j], 1, keep)
    end
    f = kept
  end
  out[i] = {e[1], f, size, lens, from[i] or 1}
end
return {nextid, out}`)

// Field is one field of an entry as Redis holds it, in order.
type Field struct {
	Name, Value string
	// NameLen and ValueLen are the full lengths; larger than len(Name) or
	// len(Value) when the entry was over entry.MaxBytes and only a prefix
	// was read.
	NameLen, ValueLen int
}

// read runs readScript over keys and decodes what it returns.
func read(ctx context.Context, rdb redis.UniversalClient, keys []string, args ...any) ([]Entry, string, error) {
	res, err := readScript.Run(ctx, rdb, keys, args...).Slice()
	if err != nil {
		return nil, "", err
	}
	if len(res) != 2 {
		return nil, "", fmt.Errorf("stream: read script answered %d values", len(res))
	}
	next, _ := res[0].(string)
	raw, _ := res[1].([]any)
	entries := make([]Entry, 0, len(raw))
	for _, r := range raw {
		e, k, err := decodeReply(r)
		if err != nil {
			return nil, "", err
		}
		if k < 1 || k > len(keys) {
			return nil, "", fmt.Errorf("stream: read script answered entry %s from key %d of %d", e.StreamID, k, len(keys))
		}
		e.Stream = keys[k-1]
		entries = append(entries, e)
	}
	return entries, next, nil
}

func decodeReply(r any) (Entry, int, error) {
	parts, _ := r.([]any)
	if len(parts) != 5 {
		return Entry{}, 0, fmt.Errorf("stream: read script answered an entry of %d parts", len(parts))
	}
	k, _ := parts[4].(int64)
	id, _ := parts[0].(string)
	elems, _ := parts[1].([]any)
	size, _ := parts[2].(int64)
	lens, _ := parts[3].([]any)
	m := redis.XMessage{ID: id, Values: make(map[string]any, len(elems)/2)}
	fields := make([]Field, 0, len(elems)/2)
	for i := 0; i+1 < len(elems); i += 2 {
		name, _ := elems[i].(string)
		value, _ := elems[i+1].(string)
		f := Field{Name: name, Value: value, NameLen: len(name), ValueLen: len(value)}
		if len(lens) > i+1 {
			nl, _ := lens[i].(int64)
			vl, _ := lens[i+1].(int64)
			f.NameLen, f.ValueLen = int(nl), int(vl)
		}
		fields = append(fields, f)
		if _, dup := m.Values[name]; !dup {
			m.Values[name] = value
		}
	}
	e := Decode(m)
	e.Fields, e.Cut, e.Size = fields, len(lens) > 0, int(size)
	e.Held = 0
	for _, f := range fields {
		e.Held += int64(len(f.Name) + len(f.Value))
	}
	if e.Cut {
		// Whatever else Decode found in the prefixes (a rune cut in
		// two, a JSON document cut short) is the cut's doing.
		e.Err = fmt.Errorf("entry %s of %d bytes exceeds the %d-byte limit (only the first %d bytes of each field were read, and are kept in its dead letter)",
			id, size, entry.MaxBytes, KeptBytes)
	}
	return e, int(k), nil
}

func readArgs(mode, group, consumer string, n int, minIdle time.Duration, start string) []any {
	return []any{mode, group, consumer, n, entry.MaxBytes, KeptBytes, keptElems,
		strconv.FormatInt(minIdle.Milliseconds(), 10), start}
}

// ReadNew reads up to n new entries for consumer with XREADGROUP, without
// blocking, an oversized entry cut as readScript says: from the bands of
// one shard (keys, in one hash slot) in the order given, so BandKeys reads
// a shard's jobs highest priority first. One key reads that key alone.
func ReadNew(ctx context.Context, rdb redis.UniversalClient, keys []string, group, consumer string, n int) ([]Entry, error) {
	entries, _, err := read(ctx, rdb, keys, readArgs("read", group, consumer, n, 0, "")...)
	return entries, err
}

// AutoClaim claims up to n entries idle past minIdle for consumer with
// XAUTOCLAIM from start, an oversized entry cut as readScript says. It
// returns the cursor to continue from ("0-0" at the end).
func AutoClaim(ctx context.Context, rdb redis.UniversalClient, stream, group, consumer string, minIdle time.Duration, start string, n int) ([]Entry, string, error) {
	return read(ctx, rdb, []string{stream}, readArgs("claim", group, consumer, n, minIdle, start)...)
}

// claimOwn takes a new delivery of entry id, which consumer still owns
// (readScript's "own" mode), and returns it with its delivery count; false
// when it is no longer pending for consumer.
func claimOwn(ctx context.Context, rdb redis.UniversalClient, stream, group, consumer, id string) (Entry, bool, error) {
	entries, count, err := read(ctx, rdb, []string{stream}, readArgs("own", group, consumer, 1, 0, id)...)
	if err != nil || len(entries) != 1 {
		return Entry{}, false, err
	}
	n, err := strconv.ParseInt(count, 10, 64)
	if err != nil {
		return Entry{}, false, fmt.Errorf("stream: claim of own entry %s answered count %q", id, count)
	}
	e := entries[0]
	e.Deliveries = n
	return e, true, nil
}
