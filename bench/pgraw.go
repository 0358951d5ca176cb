package bench

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// PGRaw is the baseline for the PostgreSQL backend: the same statements,
// sent with pgx straight from the benchmark, at the same isolation level
// (SERIALIZABLE) and pool size, with no kiroku layer in between. The gap
// between it and the backend is what kiroku's storage layer costs.
type PGRaw struct {
	DSN      string
	MaxConns int32
	pool     *pgxpool.Pool
	schema   string
}

func (p *PGRaw) Name() string { return "raw pgx (baseline)" }

func (p *PGRaw) Setup(ctx context.Context, accounts int) error {
	cfg, err := pgxpool.ParseConfig(p.DSN)
	if err != nil {
		return err
	}
	if p.MaxConns > 0 {
		cfg.MaxConns = p.MaxConns
	}
	cfg.ConnConfig.RuntimeParams["default_transaction_isolation"] = "serializable"
	if p.pool, err = pgxpool.NewWithConfig(ctx, cfg); err != nil {
		return err
	}
	p.schema = randomName("benchraw_")
	s := pgx.Identifier{p.schema}.Sanitize()
	for _, q := range []string{
		"CREATE SCHEMA " + s,
		"CREATE TABLE " + s + ".kv (k bigint PRIMARY KEY, v bytea)",
		"CREATE TABLE " + s + ".accounts (id bigint PRIMARY KEY, balance bigint)",
		fmt.Sprintf("INSERT INTO %s.accounts SELECT g, 1000 FROM generate_series(0, %d) g", s, accounts-1),
	} {
		if _, err := p.pool.Exec(ctx, q); err != nil {
			return err
		}
	}
	return nil
}

func (p *PGRaw) Put(ctx context.Context, key int64, value []byte) error {
	_, err := p.pool.Exec(ctx, "INSERT INTO "+p.schema+".kv (k, v) VALUES ($1, $2) ON CONFLICT (k) DO UPDATE SET v = EXCLUDED.v", key, value)
	return err
}

// CondPut retries serialization failures (SERIALIZABLE, with other
// workers' puts beside it) with the same policy as Transfer.
func (p *PGRaw) CondPut(ctx context.Context, key int64, old, value []byte) error {
	for retries := 0; ; retries++ {
		tag, err := p.pool.Exec(ctx, "UPDATE "+p.schema+".kv SET v = $1 WHERE k = $2 AND v = $3", value, key, old)
		var pe *pgconn.PgError
		if errors.As(err, &pe) && (pe.Code == "40001" || pe.Code == "40P01") && retries+1 < transferPolicy.MaxAttempts {
			if err := transferPolicy.Sleep(ctx, retries); err != nil {
				return err
			}
			continue
		}
		if err == nil && tag.RowsAffected() != 1 {
			err = fmt.Errorf("key %d: the condition did not hold", key)
		}
		return err
	}
}

func (p *PGRaw) Get(ctx context.Context, key int64) error {
	var v []byte
	return p.pool.QueryRow(ctx, "SELECT k, v FROM "+p.schema+".kv WHERE k = $1", key).Scan(new(int64), &v)
}

// Transfer retries serialization failures and deadlocks with the same
// policy as the storage layer's Update in the bench (transferPolicy), so
// the two differ only in the layer, not in how they back off.
func (p *PGRaw) Transfer(ctx context.Context, from, to, amount int64) (int, error) {
	for retries := 0; ; retries++ {
		err := p.transferOnce(ctx, from, to, amount)
		var pe *pgconn.PgError
		if errors.As(err, &pe) && (pe.Code == "40001" || pe.Code == "40P01") && retries+1 < transferPolicy.MaxAttempts {
			if err := transferPolicy.Sleep(ctx, retries); err != nil {
				return retries, err
			}
			continue
		}
		return retries, err
	}
}

func (p *PGRaw) transferOnce(ctx context.Context, from, to, amount int64) error {
	tx, err := p.pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.Serializable})
	if err != nil {
		return err
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	var a, b int64
	if err := tx.QueryRow(ctx, "SELECT balance FROM "+p.schema+".accounts WHERE id = $1", from).Scan(&a); err != nil {
		return err
	}
	if err := tx.QueryRow(ctx, "SELECT balance FROM "+p.schema+".accounts WHERE id = $1", to).Scan(&b); err != nil {
		return err
	}
	if a >= amount {
		upsert := "INSERT INTO " + p.schema + ".accounts (id, balance) VALUES ($1, $2) ON CONFLICT (id) DO UPDATE SET balance = EXCLUDED.balance"
		if _, err := tx.Exec(ctx, upsert, from, a-amount); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, upsert, to, b+amount); err != nil {
			return err
		}
	}
	return tx.Commit(ctx)
}

func (p *PGRaw) Total(ctx context.Context) (int64, error) {
	var total int64
	err := p.pool.QueryRow(ctx, "SELECT sum(balance) FROM "+p.schema+".accounts").Scan(&total)
	return total, err
}

func (p *PGRaw) Teardown(ctx context.Context) error {
	if p.pool == nil {
		return nil
	}
	defer p.pool.Close()
	_, err := p.pool.Exec(ctx, "DROP SCHEMA "+pgx.Identifier{p.schema}.Sanitize()+" CASCADE")
	return err
}
