package outbox

import (
	"context"
	"crypto/rand"
	"fmt"

	"github.com/usherhq/usher/internal/entry"
)

// signingKeyName is the key's row in runtime_secrets.
const signingKeyName = "stream_signing_key"

// LoadSigningKey returns the cluster's stream signing key from the
// runtime_secrets table, generating a random 32-byte key first if there is
// none. Hosts starting at once agree: each inserts its candidate with ON
// CONFLICT DO NOTHING, then all read back the one row that won.
func LoadSigningKey(ctx context.Context, q Querier) ([]byte, error) {
	candidate := make([]byte, entry.MinKeyLen)
	if _, err := rand.Read(candidate); err != nil {
		return nil, fmt.Errorf("outbox: generate signing key: %w", err)
	}
	if _, err := q.Exec(ctx, `INSERT INTO runtime_secrets (name, value) VALUES ($1, $2) ON CONFLICT (name) DO NOTHING`,
		signingKeyName, candidate); err != nil {
		return nil, fmt.Errorf("outbox: store signing key: %w", err)
	}
	var key []byte
	if err := q.QueryRow(ctx, `SELECT value FROM runtime_secrets WHERE name = $1`, signingKeyName).Scan(&key); err != nil {
		return nil, fmt.Errorf("outbox: read signing key: %w", err)
	}
	if len(key) < entry.MinKeyLen {
		return nil, fmt.Errorf("outbox: the signing key in runtime_secrets is %d bytes; at least %d are needed", len(key), entry.MinKeyLen)
	}
	return key, nil
}
