package server

import "testing"

// TestRunKeyIDs: a run's store id encodes (key name, turn id) without
// ambiguity, and reads back; without keys it is the turn id.
func TestRunKeyIDs(t *testing.T) {
	keys := []runKey{
		{client: "a", turnID: "1:x", attempt: 1},
		{client: "a:1", turnID: "x", attempt: 1},
		{client: "a", turnID: "", attempt: 2},
		{client: "ключ", turnID: "id:with:colons", attempt: 3},
		{client: "10", turnID: "x", attempt: 1},
	}
	seen := map[string]runKey{}
	for _, k := range keys {
		id := k.id()
		if other, ok := seen[id]; ok {
			t.Fatalf("%+v and %+v share the store id %q", k, other, id)
		}
		seen[id] = k
		if got := storedKey(id, k.attempt, true); got != k {
			t.Errorf("storedKey(%q) = %+v, want %+v", id, got, k)
		}
	}
	raw := runKey{turnID: "2:ab:c", attempt: 1}
	if raw.id() != "2:ab:c" || storedKey("2:ab:c", 1, false) != raw {
		t.Errorf("without keys the id is the turn id: %q, %+v", raw.id(), storedKey("2:ab:c", 1, false))
	}
	for _, id := range []string{"x", "0::x", "01:a:x", "5:ab:x", "-1:a:x"} {
		if got := storedKey(id, 1, true); got != (runKey{turnID: id, attempt: 1}) {
			t.Errorf("storedKey(%q) = %+v, want the id as it is", id, got)
		}
	}
}
