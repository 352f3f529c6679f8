package durable

import "testing"

// TestRunKeyIDs: a run's store id encodes (key name, turn id) without
// ambiguity, and reads back; without keys it is the turn id.
func TestRunKeyIDs(t *testing.T) {
	keys := []Key{
		{Client: "a", TurnID: "1:x", Attempt: 1},
		{Client: "a:1", TurnID: "x", Attempt: 1},
		{Client: "a", TurnID: "", Attempt: 2},
		{Client: "ключ", TurnID: "id:with:colons", Attempt: 3},
		{Client: "10", TurnID: "x", Attempt: 1},
	}
	seen := map[string]Key{}
	for _, k := range keys {
		id := k.id()
		if other, ok := seen[id]; ok {
			t.Fatalf("%+v and %+v share the store id %q", k, other, id)
		}
		seen[id] = k
		if got := storedKey(id, k.Attempt, true); got != k {
			t.Errorf("storedKey(%q) = %+v, want %+v", id, got, k)
		}
	}
	raw := Key{TurnID: "2:ab:c", Attempt: 1}
	if raw.id() != "2:ab:c" || storedKey("2:ab:c", 1, false) != raw {
		t.Errorf("without keys the id is the turn id: %q, %+v", raw.id(), storedKey("2:ab:c", 1, false))
	}
	for _, id := range []string{"x", "0::x", "01:a:x", "5:ab:x", "-1:a:x"} {
		if got := storedKey(id, 1, true); got != (Key{TurnID: id, Attempt: 1}) {
			t.Errorf("storedKey(%q) = %+v, want the id as it is", id, got)
		}
	}
}
