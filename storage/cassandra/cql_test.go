package cassandra

import (
	"errors"
	"fmt"
	"math"
	"strings"
	"testing"

	"github.com/kiroku-db/kiroku/storage"
)

func testTable() *relTable {
	return newRelTable("ks", &storage.Table{Namespace: "ns", Name: "t",
		PartitionKey: []storage.Column{{Name: "p", Type: storage.TypeText}, {Name: "q", Type: storage.TypeBigInt}},
		ClusteringKey: []storage.ClusteringColumn{{Name: "a", Type: storage.TypeBigInt, Order: storage.Asc},
			{Name: "b", Type: storage.TypeText, Order: storage.Desc}, {Name: "c", Type: storage.TypeBigInt, Order: storage.Asc}},
		Columns: []storage.Column{{Name: "v", Type: storage.TypeBlob}, {Name: "w", Type: storage.TypeBigInt},
			{Name: "d", Type: storage.TypeDouble}, {Name: "ts", Type: storage.TypeTimestamp}}},
		"ns_t_0011223344556677", "5a1c395e-b41f-11e5-9f22-ba0be0483c18")
}

// show renders a statement and its arguments.
func show(st stmt) string {
	var args []string
	for _, a := range st.args {
		a := a.(arg)
		s := a.v.String()
		if a.pk {
			s = "pk:" + s
		}
		args = append(args, s)
	}
	return st.cql + " [" + strings.Join(args, " ") + "]"
}

func TestCQLGolden(t *testing.T) {
	tb := testTable()
	p := storage.Values{"p": storage.Text("x"), "q": storage.BigInt(1)}
	ck := storage.Values{"a": storage.BigInt(2), "b": storage.Text("y"), "c": storage.BigInt(3)}
	put := func(vals storage.Values, cond *storage.Condition) string {
		return show(writeCQL(tb, putWrite(&storage.Put{Partition: p, Clustering: ck, Values: vals, Condition: cond})))
	}
	del := func(cond *storage.Condition) string {
		return show(writeCQL(tb, deleteWrite(&storage.Delete{Partition: p, Clustering: ck, Condition: cond})))
	}
	get, _ := getCQL(tb, &storage.Get{Partition: p, Clustering: ck, Projection: []string{"w", "a"}})
	const key = `"p" = ? AND "q" = ? AND "a" = ? AND "b" = ? AND "c" = ?`
	const keyArgs = `pk:"x" 1 2 "y" 3`
	w := storage.Values{"w": storage.BigInt(7), "v": storage.Null()}
	neg0 := storage.Double(math.Copysign(0, -1))
	cases := []struct{ got, want string }{
		{createTableCQL(tb), `CREATE TABLE IF NOT EXISTS "ks"."ns_t_0011223344556677" ("p" blob, "q" bigint, "a" bigint, "b" text, "c" bigint, ` +
			`"v" blob, "w" bigint, "d" double, "ts" bigint, "_exists" boolean, PRIMARY KEY (("p", "q"), "a", "b", "c")) ` +
			`WITH ID = 5a1c395e-b41f-11e5-9f22-ba0be0483c18 AND CLUSTERING ORDER BY ("a" ASC, "b" DESC, "c" ASC) AND comment = 'kiroku table ns.t'`},
		{show(get), `SELECT "w", "a", "_exists" FROM "ks"."ns_t_0011223344556677" WHERE ` + key + ` [` + keyArgs + `]`},
		// Every write is a lightweight transaction; without a condition, one that always holds.
		{put(w, nil), `UPDATE "ks"."ns_t_0011223344556677" SET "v" = ?, "w" = ?, "_exists" = true WHERE ` + key +
			` IF "_exists" IN (null, true) [NULL 7 ` + keyArgs + `]`},
		{put(nil, storage.IfNotExists()), `UPDATE "ks"."ns_t_0011223344556677" SET "_exists" = true WHERE ` + key + ` IF "_exists" = null [` + keyArgs + `]`},
		{put(nil, storage.IfExists()), `UPDATE "ks"."ns_t_0011223344556677" SET "_exists" = true WHERE ` + key + ` IF "_exists" = true [` + keyArgs + `]`},
		// <> also requires NOT NULL; key columns are left to keyHolds.
		{put(w, storage.If(storage.Ne("w", storage.BigInt(3)), storage.IsNull("v"), storage.Eq("a", storage.BigInt(2)), storage.IsNotNull("ts"))),
			`UPDATE "ks"."ns_t_0011223344556677" SET "v" = ?, "w" = ?, "_exists" = true WHERE ` + key +
				` IF "_exists" = true AND "w" != ? AND "w" != null AND "v" = null AND "ts" != null [NULL 7 ` + keyArgs + ` 3]`},
		// DOUBLE zero operands cover both zeros.
		{del(storage.If(storage.Eq("d", storage.Double(0)), storage.Ne("d", neg0), storage.Lt("d", storage.Double(0)),
			storage.Le("d", neg0), storage.Gt("d", neg0), storage.Ge("d", storage.Double(0)), storage.Lt("d", storage.Double(1)))),
			`DELETE FROM "ks"."ns_t_0011223344556677" WHERE ` + key + ` IF "_exists" = true AND "d" IN (?, ?) AND "d" != ? AND "d" != ? AND "d" != null` +
				` AND "d" < ? AND "d" <= ? AND "d" > ? AND "d" >= ? AND "d" < ? [` + keyArgs + ` -0 0 -0 0 -0 0 0 -0 1]`},
		{del(nil), `DELETE FROM "ks"."ns_t_0011223344556677" WHERE ` + key + ` IF "_exists" IN (null, true) [` + keyArgs + `]`},
	}
	scan := func(start, end *storage.Bound, order storage.Order, limit int) string {
		pl := scanCQL(tb, &storage.Scan{Partition: p, Start: start, End: end, Order: order, Limit: limit, Projection: []string{"v"}}, true)
		return fmt.Sprintf("%s exact=%v empty=%v", show(pl.stmt), pl.exact, pl.empty)
	}
	const sel = `SELECT "v", "_exists" FROM "ks"."ns_t_0011223344556677" WHERE "p" = ? AND "q" = ?`
	const selAll = `SELECT "v", "a", "b", "c", "_exists" FROM "ks"."ns_t_0011223344556677" WHERE "p" = ? AND "q" = ?`
	b := func(incl bool, kv ...any) *storage.Bound {
		k := storage.Values{}
		for i := 0; i < len(kv); i += 2 {
			k[kv[i].(string)] = kv[i+1].(storage.Value)
		}
		return &storage.Bound{Key: k, Inclusive: incl}
	}
	a2, by := storage.BigInt(2), storage.Text("y")
	cases = append(cases, []struct{ got, want string }{
		{scan(nil, nil, storage.Asc, 5), sel + ` LIMIT 5 [pk:"x" 1] exact=true empty=false`},
		{scan(nil, nil, storage.Desc, 0), sel + ` ORDER BY "a" DESC, "b" ASC, "c" DESC [pk:"x" 1] exact=true empty=false`},
		// One column: exact, a multi-column slice of one.
		{scan(b(false, "a", a2), b(true, "a", storage.BigInt(3)), storage.Asc, 4),
			sel + ` AND ("a") > (?) AND ("a") <= (?) LIMIT 4 [pk:"x" 1 2 3] exact=true empty=false`},
		// Mixed directions: the leading run, inclusive; filtered, so no LIMIT.
		{scan(b(false, "a", a2, "b", by), nil, storage.Asc, 4),
			selAll + ` AND ("a") >= (?) [pk:"x" 1 2] exact=false empty=false`},
		{scan(nil, b(false, "a", a2, "b", by, "c", storage.BigInt(1)), storage.Desc, 0),
			selAll + ` AND ("a") <= (?) ORDER BY "a" DESC, "b" ASC, "c" DESC [pk:"x" 1 2] exact=false empty=false`},
		// Start after end.
		{scan(b(true, "a", storage.BigInt(3)), b(true, "a", storage.BigInt(1), "b", by), storage.Asc, 0),
			selAll + ` AND ("a") >= (?) AND ("a") <= (?) [pk:"x" 1 3 1] exact=false empty=true`},
	}...)
	for i, c := range cases {
		if c.got != c.want {
			t.Errorf("case %d:\n got  %s\n want %s", i, c.got, c.want)
		}
	}

	// A uniform DESC prefix is one exact slice, its comparison flipped.
	ut := newRelTable("ks", &storage.Table{Namespace: "ns", Name: "u", PartitionKey: []storage.Column{{Name: "p", Type: storage.TypeBigInt}},
		ClusteringKey: []storage.ClusteringColumn{{Name: "x", Type: storage.TypeBigInt, Order: storage.Desc}, {Name: "y", Type: storage.TypeText, Order: storage.Desc}}},
		"ns_u_0", "5a1c395e-b41f-11e5-9f22-ba0be0483c18")
	pl := scanCQL(ut, &storage.Scan{Partition: storage.Values{"p": storage.BigInt(1)},
		Start: b(true, "x", a2, "y", by), End: b(false, "x", storage.BigInt(1)), Order: storage.Desc, Limit: 2}, true)
	if got, want := show(pl.stmt), `SELECT "p", "x", "y", "_exists" FROM "ks"."ns_u_0" WHERE "p" = ? AND ("x", "y") <= (?, ?) AND ("x") > (?) `+
		`ORDER BY "x" ASC, "y" ASC LIMIT 2 [1 2 "y" 1]`; got != want || !pl.exact {
		t.Errorf("uniform DESC scan:\n got  %s (exact %v)\n want %s", got, pl.exact, want)
	}
}

// TestFold: the mutations of one row become one statement with their
// combined effect; a condition after the first on a row is refused.
func TestFold(t *testing.T) {
	tb := testTable()
	p := storage.Values{"p": storage.Text("x"), "q": storage.BigInt(1)}
	ck := func(a int64) storage.Values {
		return storage.Values{"a": storage.BigInt(a), "b": storage.Text("y"), "c": storage.BigInt(3)}
	}
	put := func(a int64, vals storage.Values, cond *storage.Condition) *storage.Put {
		return &storage.Put{Partition: p, Clustering: ck(a), Values: vals, Condition: cond}
	}
	del := func(a int64) *storage.Delete { return &storage.Delete{Partition: p, Clustering: ck(a)} }
	one := storage.Values{"w": storage.BigInt(1), "d": storage.Double(1)}
	two := storage.Values{"w": storage.BigInt(2)}
	ws, err := fold(tb, []storage.Mutation{
		put(1, one, storage.IfExists()), put(2, one, nil), put(1, two, nil), // 1: merged, the later value wins
		del(2), put(2, two, nil), // 2: a fresh row: every other value column NULL
		put(3, one, nil), del(3), // 3: deleted
	})
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, w := range ws {
		got = append(got, show(writeCQL(tb, w)))
	}
	const key = `"p" = ? AND "q" = ? AND "a" = ? AND "b" = ? AND "c" = ?`
	want := []string{
		`UPDATE "ks"."ns_t_0011223344556677" SET "w" = ?, "d" = ?, "_exists" = true WHERE ` + key + ` IF "_exists" = true [2 1 pk:"x" 1 1 "y" 3]`,
		`UPDATE "ks"."ns_t_0011223344556677" SET "v" = ?, "w" = ?, "d" = ?, "ts" = ?, "_exists" = true WHERE ` + key +
			` IF "_exists" IN (null, true) [NULL 2 NULL NULL pk:"x" 1 2 "y" 3]`,
		`DELETE FROM "ks"."ns_t_0011223344556677" WHERE ` + key + ` IF "_exists" IN (null, true) [pk:"x" 1 3 "y" 3]`,
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("folded:\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if ws[0].first != 0 || ws[1].first != 1 || ws[2].first != 5 {
		t.Fatalf("first mutations: %d %d %d", ws[0].first, ws[1].first, ws[2].first)
	}
	// The request's maps are not changed.
	if len(one) != 2 || !one["w"].Equal(storage.BigInt(1)) {
		t.Fatalf("fold changed a request: %v", one)
	}
	for _, ms := range [][]storage.Mutation{
		{put(1, one, nil), put(1, two, storage.IfExists())},
		{&storage.Put{Partition: p, Clustering: ck(1), Condition: storage.IfExists(), Skippable: true}, del(1)},
	} {
		if _, err := fold(tb, ms); !errors.Is(err, storage.ErrInvalidArgument) {
			t.Errorf("fold of %v: %v, want ErrInvalidArgument", ms, err)
		}
	}
}

// TestKeyConditions: expressions on key columns are judged on the request.
func TestKeyConditions(t *testing.T) {
	tb := testTable()
	p := storage.Values{"p": storage.Text("x"), "q": storage.BigInt(1)}
	ck := storage.Values{"a": storage.BigInt(2), "b": storage.Text("y"), "c": storage.BigInt(3)}
	for _, c := range []struct {
		cond *storage.Condition
		want bool
	}{
		{nil, true}, {storage.IfExists(), true},
		{storage.If(storage.Eq("q", storage.BigInt(1)), storage.Gt("b", storage.Text("x")), storage.IsNotNull("a")), true},
		{storage.If(storage.Eq("w", storage.BigInt(9)), storage.Ne("p", storage.Text("x"))), false},
		{storage.If(storage.IsNull("c")), false},
	} {
		if got := keyHolds(tb, c.cond, p, ck); got != c.want {
			t.Errorf("keyHolds(%+v) = %v, want %v", c.cond, got, c.want)
		}
	}
}

// TestConfigValidate: defaults are filled, contradictions refused.
func TestConfigValidate(t *testing.T) {
	c := Config{Contacts: []string{"127.0.0.1:19042", "127.0.0.2:19042"}}
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	if c.Port != 19042 || c.Keyspace != "kiroku" || c.consistency.String() != "QUORUM" || c.serial.String() != "SERIAL" ||
		c.read.String() != "SERIAL" || c.Limits.MaxWriteSize != 8<<20 || c.PageSize != 5000 {
		t.Fatalf("defaults: %+v", c)
	}
	c = Config{Contacts: []string{"h"}, SerialConsistency: "local_serial", Consistency: "LOCAL_QUORUM"}
	if err := c.Validate(); err != nil || c.Port != 9042 || c.read.String() != "LOCAL_SERIAL" {
		t.Fatalf("LOCAL_SERIAL: %v %+v", err, c)
	}
	for name, bad := range map[string]Config{
		"no contacts":       {},
		"ports disagree":    {Contacts: []string{"a:1", "b:2"}},
		"port vs contacts":  {Contacts: []string{"a:1"}, Port: 2},
		"bad port":          {Contacts: []string{"a:x"}},
		"serial as commit":  {Contacts: []string{"a"}, Consistency: "SERIAL"},
		"quorum as serial":  {Contacts: []string{"a"}, SerialConsistency: "QUORUM"},
		"ONE reads":         {Contacts: []string{"a"}, ReadConsistency: "ONE"},
		"keyspace name":     {Contacts: []string{"a"}, Keyspace: "Kiroku-1"},
		"write over half":   {Contacts: []string{"a"}, Limits: storage.Limits{MaxWriteSize: 9 << 20}},
		"value over writes": {Contacts: []string{"a"}, Limits: storage.Limits{MaxValueSize: 12 << 20}},
		"negative":          {Contacts: []string{"a"}, PageSize: -1},
	} {
		if err := bad.Validate(); err == nil {
			t.Errorf("%s: Validate accepted %+v", name, bad)
		}
	}
}
