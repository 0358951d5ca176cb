package storage

import (
	"errors"
	"testing"
)

// TestCheckPutNamesTheFirstBadColumn: however the map iterates, a put with
// several bad columns is refused naming the first in name order, and a
// good put passes.
func TestCheckPutNamesTheFirstBadColumn(t *testing.T) {
	tab := &Table{Namespace: "n", Name: "t", PartitionKey: []Column{{Name: "k", Type: TypeText}},
		Columns: []Column{{Name: "b", Type: TypeBigInt}, {Name: "d", Type: TypeText}, {Name: "f", Type: TypeBigInt}}}
	lim, _ := Limits{}.WithDefaults()
	key := Values{"k": Text("x")}
	if err := tab.CheckPut(&Put{Partition: key, Values: Values{"b": BigInt(1), "d": Text("y"), "f": Null()}}, lim); err != nil {
		t.Fatal(err)
	}
	bad := Values{"b": BigInt(1), "c": BigInt(2), "d": BigInt(3), "e": Text("z"), "f": Text("w"), "k": Text("x")}
	for range 50 {
		err := tab.CheckPut(&Put{Partition: key, Values: bad}, lim)
		var se *Error
		if !errors.As(err, &se) || se.Column != "c" || !errors.Is(err, ErrUnknownColumn) {
			t.Fatalf("got %v, want the unknown column c", err)
		}
	}
}
