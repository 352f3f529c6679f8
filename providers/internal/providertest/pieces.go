package providertest

// Pieces is a response body that hands out B a few bytes at a time, in
// reads of varying sizes, then returns End: the arrival of a body in
// pieces, so that a decoder's handling of events cut across reads is
// exercised.
type Pieces struct {
	B   []byte
	End error
	n   int
}

// Read implements io.Reader.
func (p *Pieces) Read(b []byte) (int, error) {
	if len(p.B) == 0 {
		return 0, p.End
	}
	p.n++
	k := min(len(b), len(p.B), 1+p.n*37%211)
	copy(b, p.B[:k])
	p.B = p.B[k:]
	return k, nil
}
