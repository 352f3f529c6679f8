// Package store keeps the log of every turn in NATS JetStream, so a turn
// outlives the stream of the client that started it: its events can be
// replayed and followed from any replica, a repeated request attaches to
// the run it repeats, and a cancellation reaches the replica running the
// turn.
//
// The engine is the same in both deployment modes: an embedded, in-process
// nats-server with no network listener and a file store under a directory
// (or memory only), or an existing NATS cluster named by URL, with
// streams replicated three times when it has three servers or more.
//
// A run is one attempt of one turn, named by (turn id, attempt). Its log is
// two subjects of one stream: the owner records (the first holds the
// run's request and is created atomically, so one run exists per name) and
// the events, each appended under an expectation on the owner records, so
// a replica that lost the run cannot append to it. A lease in a key-value
// bucket, renewed by the owner, tells whether the run still has a live
// owner; an owner shutting down releases it (purges it), which the other
// replicas see as they see an expired one, so one takes the run over at
// once. The embedded store, one process, writes no lease: its runs are
// held in the process (see lease.go). Control signals (cancel, a watcher's presence) travel to the owner
// over core NATS, to the replica the run's last owner record names, which
// takes the signals of all its runs on one subscription.
//
// Three more buckets hold what every replica shares ([Shared]): the
// models' cooldowns, each under a key that expires with it, their retry
// budgets, one key per model changed only by compare-and-swap on its
// revision, and the client keys' limits.
//
// Inside, a type per concept, each owning its state and the lock that
// guards it: [Store] is the face, and holds the connection, the log's
// stream, the inbox of the runs' signals (control.go) and the writers'
// senders; a writer is one run this replica owns (writer.go, and its
// lease's renewal, renew.go); leases says who owns each run (lease.go); the
// publisher publishes to the log and the lease bucket (publish.go,
// puback.go); the keeper keeps the log within its bounds (capacity.go,
// evict.go, disk.go, reserve.go, failedwrite.go); [Shared] holds what the
// replicas share. The set-up is functions (setup.go,
// connect.go) that return what they start and make.
//
// The package stores bytes: it knows nothing of the wire form of an event,
// which the server chooses.
package store
