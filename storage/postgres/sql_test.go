package postgres

import (
	"fmt"
	"testing"

	"github.com/kiroku-db/kiroku/storage"
)

func testTable() *relTable {
	return newRelTable(&storage.Table{Namespace: "ns", Name: "t",
		PartitionKey: []storage.Column{{Name: "p", Type: storage.TypeBigInt}},
		ClusteringKey: []storage.ClusteringColumn{{Name: "a", Type: storage.TypeBigInt, Order: storage.Asc},
			{Name: "b", Type: storage.TypeText, Order: storage.Asc}, {Name: "c", Type: storage.TypeText, Order: storage.Desc}},
		Columns: []storage.Column{{Name: "v", Type: storage.TypeBlob}, {Name: "w", Type: storage.TypeBigInt}}}, "t$x")
}

func TestSQLGolden(t *testing.T) {
	tb := testTable()
	p := storage.Values{"p": storage.BigInt(1)}
	ck := storage.Values{"a": storage.BigInt(2), "b": storage.Text("x"), "c": storage.Text("y")}
	scan := func(start, end *storage.Bound, order storage.Order, limit int) string {
		sql, args, _ := scanSQL(tb, &storage.Scan{Namespace: "ns", Table: "t", Partition: p, Start: start, End: end, Order: order, Limit: limit, Projection: []string{"v"}})
		return fmt.Sprint(sql, " ", args)
	}
	cases := []struct{ got, want string }{
		{createTableSQL(tb)[0], `CREATE TABLE "ns"."t$x" ("p" bigint NOT NULL, "a" bigint NOT NULL, "b" text COLLATE "C" NOT NULL, ` +
			`"c" text COLLATE "C" NOT NULL, "v" bytea, "w" bigint, CONSTRAINT "t$x$pk" PRIMARY KEY ("p", "a", "b", "c"))`},
		{createTableSQL(tb)[1], `CREATE INDEX "t$x$order" ON "ns"."t$x" ("p", "a" ASC, "b" ASC, "c" DESC)`},
		// Same-direction prefix: a row comparison.
		{scan(&storage.Bound{Key: storage.Values{"a": storage.BigInt(2), "b": storage.Text("x")}, Inclusive: true}, nil, storage.Asc, 0),
			`SELECT "v" FROM "ns"."t$x" WHERE "p" = $1 AND ("a", "b") >= ($2, $3) ORDER BY "a" ASC, "b" ASC, "c" DESC [1 2 x]`},
		{scan(nil, &storage.Bound{Key: storage.Values{"a": storage.BigInt(2)}}, storage.Desc, 5),
			`SELECT "v" FROM "ns"."t$x" WHERE "p" = $1 AND "a" < $2 ORDER BY "a" DESC, "b" DESC, "c" ASC LIMIT 5 [1 2]`},
		// Mixed directions: the lexicographic order spelled out.
		{scan(&storage.Bound{Key: ck}, nil, storage.Asc, 0),
			`SELECT "v" FROM "ns"."t$x" WHERE "p" = $1 AND (("a" > $2) OR ("a" = $3 AND "b" > $4) OR ("a" = $5 AND "b" = $6 AND "c" < $7)) ` +
				`ORDER BY "a" ASC, "b" ASC, "c" DESC [1 2 2 x 2 x y]`},
		{scan(nil, &storage.Bound{Key: ck, Inclusive: true}, storage.Asc, 0),
			`SELECT "v" FROM "ns"."t$x" WHERE "p" = $1 AND (("a" < $2) OR ("a" = $3 AND "b" < $4) OR ("a" = $5 AND "b" = $6 AND "c" > $7) ` +
				`OR ("a" = $8 AND "b" = $9 AND "c" = $10)) ORDER BY "a" ASC, "b" ASC, "c" DESC [1 2 2 x 2 x y 2 x y]`},
	}
	put := func(vals storage.Values, cond *storage.Condition) string {
		sql, args := putSQL(tb, &storage.Put{Partition: p, Clustering: ck, Values: vals, Condition: cond})
		return fmt.Sprint(sql, " ", args)
	}
	del := func(cond *storage.Condition) string {
		sql, args := deleteSQL(tb, &storage.Delete{Partition: p, Clustering: ck, Condition: cond})
		return fmt.Sprint(sql, " ", args)
	}
	expect := func(cond *storage.Condition) string {
		sql, args := expectSQL(tb, &storage.Expect{Partition: p, Clustering: ck, Condition: cond})
		return fmt.Sprint(sql, " ", args)
	}
	w := storage.Values{"w": storage.BigInt(7), "v": storage.Null()}
	cases = append(cases, []struct{ got, want string }{
		{put(w, nil), `INSERT INTO "ns"."t$x" ("p", "a", "b", "c", "v", "w") VALUES ($1, $2, $3, $4, $5, $6) ` +
			`ON CONFLICT ("p", "a", "b", "c") DO UPDATE SET "v" = EXCLUDED."v", "w" = EXCLUDED."w" [1 2 x y <nil> 7]`},
		{put(nil, nil), `INSERT INTO "ns"."t$x" ("p", "a", "b", "c") VALUES ($1, $2, $3, $4) ON CONFLICT ("p", "a", "b", "c") DO NOTHING [1 2 x y]`},
		{put(w, storage.IfNotExists()), `INSERT INTO "ns"."t$x" ("p", "a", "b", "c", "v", "w") VALUES ($1, $2, $3, $4, $5, $6) ` +
			`ON CONFLICT ("p", "a", "b", "c") DO NOTHING [1 2 x y <nil> 7]`},
		{put(w, storage.IfExists()), `UPDATE "ns"."t$x" SET "v" = $1, "w" = $2 WHERE "p" = $3 AND "a" = $4 AND "b" = $5 AND "c" = $6 [<nil> 7 1 2 x y]`},
		{put(nil, storage.IfExists()), `UPDATE "ns"."t$x" SET "p" = "p" WHERE "p" = $1 AND "a" = $2 AND "b" = $3 AND "c" = $4 [1 2 x y]`},
		{put(w, storage.If(storage.Ge("w", storage.BigInt(3)), storage.IsNull("v"))),
			`UPDATE "ns"."t$x" SET "v" = $1, "w" = $2 WHERE "p" = $3 AND "a" = $4 AND "b" = $5 AND "c" = $6 AND "w" >= $7 AND "v" IS NULL [<nil> 7 1 2 x y 3]`},
		{del(storage.If(storage.Ne("w", storage.BigInt(1)))),
			`DELETE FROM "ns"."t$x" WHERE "p" = $1 AND "a" = $2 AND "b" = $3 AND "c" = $4 AND "w" <> $5 [1 2 x y 1]`},
		{expect(storage.If(storage.Lt("w", storage.BigInt(9)))),
			`SELECT 1 / count(*) FROM "ns"."t$x" WHERE "p" = $1 AND "a" = $2 AND "b" = $3 AND "c" = $4 AND "w" < $5 [1 2 x y 9]`},
		{expect(storage.IfNotExists()),
			`SELECT 1 / (1 - count(*)) FROM "ns"."t$x" WHERE "p" = $1 AND "a" = $2 AND "b" = $3 AND "c" = $4 [1 2 x y]`},
	}...)
	for i, c := range cases {
		if c.got != c.want {
			t.Errorf("case %d:\n got  %s\n want %s", i, c.got, c.want)
		}
	}
}

// BenchmarkStatements builds the statements of a ledger execute: a get, an
// insert, a conditional update and a deferred insert.
func BenchmarkStatements(b *testing.B) {
	tb := testTable()
	p := storage.Values{"p": storage.BigInt(1)}
	ck := storage.Values{"a": storage.BigInt(2), "b": storage.Text("x"), "c": storage.Text("y")}
	vals := storage.Values{"v": storage.Blob([]byte("payload")), "w": storage.BigInt(3)}
	get := &storage.Get{Namespace: "ns", Table: "t", Partition: p, Clustering: ck, Projection: []string{"v"}}
	ins := &storage.Put{Namespace: "ns", Table: "t", Partition: p, Clustering: ck, Values: vals}
	upd := &storage.Put{Namespace: "ns", Table: "t", Partition: p, Clustering: ck, Values: vals,
		Condition: storage.If(storage.Eq("w", storage.BigInt(2)))}
	def := &storage.Put{Namespace: "ns", Table: "t", Partition: p, Clustering: ck, Values: vals,
		Condition: storage.IfNotExists(), Deferred: true}
	b.ReportAllocs()
	for b.Loop() {
		getSQL(tb, get)
		putSQL(tb, ins)
		putSQL(tb, upd)
		deferredSQL(tb, def)
	}
}
