package store

import (
	"encoding/base64"
	"strconv"
)

// runKey names one run: a turn id and an attempt.
type runKey struct {
	turnID  string
	attempt uint32
}

// token encodes the turn id as one subject token: any UTF-8 id maps to
// letters, digits, '-' and '_', without collisions.
func (k runKey) token() string { return base64.RawURLEncoding.EncodeToString([]byte(k.turnID)) }

func (k runKey) prefix() string {
	return subjectRoot + "." + k.token() + "." + strconv.FormatUint(uint64(k.attempt), 10)
}

// own is the subject of the run's owner records; the first holds its
// request.
func (k runKey) own() string { return k.prefix() + ".own" }

// events is the subject of the run's events.
func (k runKey) events() string { return k.prefix() + ".ev" }

// control is the run's own core NATS subject for signals, which an owner
// of the version before listened on; this version's go to the owner's
// replica ([runKey.controlAt]).
func (k runKey) control() string {
	return controlRoot + "." + k.token() + "." + strconv.FormatUint(uint64(k.attempt), 10)
}

// lease is the run's key in the lease bucket.
func (k runKey) lease() string { return k.token() + "." + strconv.FormatUint(uint64(k.attempt), 10) }

// alive is the run's own core NATS subject of the question whether its
// owner is renewing the run's lease, as control.
func (k runKey) alive() string { return k.control() + ".alive" }
