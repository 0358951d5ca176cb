package main

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/kiroku-db/kiroku/client"
	"github.com/kiroku-db/kiroku/proof"
	"github.com/kiroku-db/kiroku/storage"
	"github.com/kiroku-db/kiroku/storage/backends"
	"github.com/kiroku-db/kiroku/validator"
)

// executeInMode executes r the way c's mode says: through the Auditor
// (the client does it), logged first by a Validator over the database
// the mode names, or straight to the ledger.
func executeInMode(ctx context.Context, c *client.Client, r *proof.Request) (*proof.Result, error) {
	mode, spec := c.Mode()
	if mode != client.ModeValidator {
		return c.ExecuteRequest(ctx, r)
	}
	db, err := openValidatorDB(ctx, spec)
	if err != nil {
		return nil, err
	}
	defer db.Close()
	v, err := validator.Open(ctx, validator.Config{DB: db, Client: c})
	if err != nil {
		return nil, err
	}
	return v.ExecuteRequest(ctx, r)
}

// openValidatorDB opens a Validator database named engine:DIR,
// postgres:DSN or cassandra:HOST:PORT,....
func openValidatorDB(ctx context.Context, spec string) (storage.Backend, error) {
	kind, arg, ok := strings.Cut(spec, ":")
	if !ok || arg == "" {
		return nil, fmt.Errorf("the Validator database %q: want engine:DIR, postgres:DSN or cassandra:HOSTS", spec)
	}
	var cfg backends.Config
	switch kind {
	case "engine":
		cfg.Dir = arg
	case "postgres":
		cfg.DSN = arg
	case "cassandra":
		cfg.Contacts = arg
	default:
		return nil, errors.New("the Validator database: " + kind + " is not engine, postgres or cassandra")
	}
	db, err := backends.Open(ctx, kind, cfg)
	if err != nil {
		return nil, fmt.Errorf("the Validator database: %w", err)
	}
	return db, nil
}
