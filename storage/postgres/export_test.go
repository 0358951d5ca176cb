package postgres

import "github.com/jackc/pgx/v5"

// WithIsolation returns cfg set to a weaker isolation level, for the test
// that shows the conformance suite detects the anomalies it allows.
func WithIsolation(cfg Config, level string) Config {
	cfg.isolation = pgx.TxIsoLevel(level)
	return cfg
}
