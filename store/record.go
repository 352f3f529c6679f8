package store

// MaxRecordBytes is the largest record the store takes: the max_payload
// of the NATS server it is connected to (the embedded server's is 8 MiB;
// a cluster's servers set their own, 1 MiB unless configured). A request
// or an event too large for one record cannot be stored.
func (s *Store) MaxRecordBytes() int { return int(s.nc.MaxPayload()) }
