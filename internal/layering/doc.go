// Package layering holds, as a test, the rule of ARCHITECTURE.md: which
// floor of the tree may import which. It has no code of its own; its test
// lists every package of the module with go list and fails on an import
// the table in layering_test.go does not allow.
package layering
