// Package policy decides what a turn does after a failed model call, and
// keeps the per-model state that decision reads across turns.
//
// The decision is data first: [Rules] holds one [Rule] per class of
// failure (transient or not, retried on the same model, when it falls back,
// whether it cools the model down, whether it compacts the conversation,
// and what the client is told), and [Policy.Decide] reads it, together
// with the state of the step ([Attempt]), to return a [Decision]. Decide
// is pure: no clock, no randomness, no I/O; the turn loop does the waiting.
//
// [Health] is the state shared by every turn of a process: per model, the
// cooldown that keeps new turns off a failing model (with a half-open
// probe) and the retry budget, which keeps retries while they work and
// stops them when they fail (an outage), refills with time, and is probed
// back after an outage. It reads time from an injected clock.
//
// The package imports only the standard library and llm.
package policy
