package runtime

import (
	"fmt"
	"net/netip"
	"net/url"
	"strconv"
	"strings"

	"golang.org/x/net/idna"

	"github.com/turnstile-dev/turnstile/llm"
)

// HostRules are the hosts and networks the URIs of a request's media may
// not name: the provider fetches such a URI, from its own network or, for
// a model server the operator runs, from the operator's. Build them with
// [ParseHostRules]; set them with [WithRefusedMediaHosts]. Nothing is
// resolved: a host name is matched by name, an IP address by network.
type HostRules struct {
	rules []hostRule
}

// hostRule is one entry of HostRules.
type hostRule struct {
	// entry is the entry as the operator wrote it, to name in errors.
	entry    string
	prefixes []netip.Prefix
	// names match a host exactly; domains match their subdomains.
	names, domains []string
}

// hostKeywords are the named sets of hosts an entry may be.
var hostKeywords = map[string]hostRule{
	"loopback": {
		prefixes: prefixes("127.0.0.0/8", "::1/128"),
		names:    []string{"localhost"}, domains: []string{"localhost"},
	},
	// RFC 1918, the shared address space of RFC 6598 (where some clouds
	// serve their metadata) and IPv6 unique local addresses.
	"private":     {prefixes: prefixes("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "100.64.0.0/10", "fc00::/7")},
	"link_local":  {prefixes: prefixes("169.254.0.0/16", "fe80::/10")},
	"unspecified": {prefixes: prefixes("0.0.0.0/8", "::/128")},
}

// DefaultRefusedMediaHosts are the entries refused when the configuration
// sets none: the machine's own addresses, private and link-local networks
// (cloud metadata services among them), and the unspecified address.
func DefaultRefusedMediaHosts() []string {
	return []string{"loopback", "private", "link_local", "unspecified"}
}

func prefixes(ss ...string) []netip.Prefix {
	out := make([]netip.Prefix, len(ss))
	for i, s := range ss {
		out[i] = netip.MustParsePrefix(s)
	}
	return out
}

// ParseHostRules parses entries, each one of: loopback (127.0.0.0/8, ::1
// and the name localhost with its subdomains), private (10.0.0.0/8,
// 172.16.0.0/12, 192.168.0.0/16, 100.64.0.0/10, fc00::/7), link_local
// (169.254.0.0/16, fe80::/10), unspecified (0.0.0.0/8, ::); a network in
// CIDR notation; an IP address; a host name, matched exactly; or "*."
// and a domain, matching its subdomains. It reports each entry it cannot
// parse, its Field the entry's index ("[2]").
func ParseHostRules(entries []string) (*HostRules, []llm.Problem) {
	h := &HostRules{}
	var problems []llm.Problem
	for i, e := range entries {
		r, err := parseHostRule(e)
		if err != nil {
			problems = append(problems, llm.Problem{Field: fmt.Sprintf("[%d]", i), Message: err.Error()})
			continue
		}
		h.rules = append(h.rules, r)
	}
	return h, problems
}

func parseHostRule(e string) (hostRule, error) {
	if r, ok := hostKeywords[e]; ok {
		r.entry = e
		return r, nil
	}
	r := hostRule{entry: e}
	if p, err := netip.ParsePrefix(e); err == nil {
		r.prefixes = []netip.Prefix{p.Masked()}
		return r, nil
	}
	if a, err := netip.ParseAddr(e); err == nil {
		r.prefixes = []netip.Prefix{netip.PrefixFrom(a, a.BitLen())}
		return r, nil
	}
	domain, sub := strings.CutPrefix(e, "*.")
	name, ok := normalHost(domain)
	if !ok || name == "" || strings.ContainsAny(name, "*/:[]@ ") {
		return hostRule{}, fmt.Errorf("%q is not loopback, private, link_local, unspecified, a network, an IP address, a host name or *.DOMAIN", e)
	}
	if sub {
		r.domains = []string{name}
	} else {
		r.names = []string{name}
	}
	return r, nil
}

// Refused says why uri may not be fetched for a request: the entry that
// refuses its host, or that its host is no valid host name or address;
// "" when it may be.
func (h *HostRules) Refused(uri string) string {
	if h == nil || len(h.rules) == 0 {
		return ""
	}
	u, err := url.Parse(uri)
	if err != nil {
		return "is not a URI"
	}
	host, ok := normalHost(u.Hostname())
	if !ok {
		return "names no valid host"
	}
	addr, isAddr := hostAddr(host)
	if !isAddr && endsInNumber(host) {
		// A fetcher reads it as an IPv4 address, or refuses it.
		return "names no valid host: it ends in a number but is no IPv4 address"
	}
	addrs := []netip.Addr{addr}
	if v4, ok := embedded(addr); ok {
		addrs = append(addrs, v4)
	}
	for _, r := range h.rules {
		switch {
		case isAddr && r.matchesAddr(addrs):
		case !isAddr && r.matchesName(host):
		default:
			continue
		}
		return fmt.Sprintf("names a host this server does not pass on (refused: %s)", r.entry)
	}
	return ""
}

func (r hostRule) matchesAddr(addrs []netip.Addr) bool {
	for _, a := range addrs {
		for _, p := range r.prefixes {
			if p.Contains(a) {
				return true
			}
		}
	}
	return false
}

func (r hostRule) matchesName(host string) bool {
	for _, n := range r.names {
		if host == n {
			return true
		}
	}
	for _, d := range r.domains {
		if strings.HasSuffix(host, "."+d) {
			return true
		}
	}
	return false
}

// lookup maps a host as URL parsers that follow the WHATWG URL standard
// do before they read it: Unicode to ASCII, case and width folded
// ("１２７.０.０.１" is 127.0.0.1).
var lookup = idna.New(idna.MapForLookup(), idna.StrictDomainName(false), idna.Transitional(false))

// normalHost returns host as a fetcher reads it: mapped to ASCII, lower
// case, without a trailing dot, an IPv6 address without its zone.
func normalHost(host string) (string, bool) {
	if a, err := netip.ParseAddr(host); err == nil {
		return a.WithZone("").String(), true
	}
	ascii, err := lookup.ToASCII(host)
	if err != nil {
		return "", false
	}
	return strings.TrimSuffix(strings.ToLower(ascii), "."), true
}

// hostAddr returns the address host names: an IP address, or an IPv4
// address in any form a WHATWG URL parser reads as one (127.1,
// 0x7f.0.0.1, 2130706433, 0177.0.0.1).
func hostAddr(host string) (netip.Addr, bool) {
	if a, err := netip.ParseAddr(host); err == nil {
		return a.Unmap(), true
	}
	if !endsInNumber(host) {
		return netip.Addr{}, false
	}
	parts := strings.Split(host, ".")
	if len(parts) > 4 {
		return netip.Addr{}, false
	}
	var nums []uint64
	for _, p := range parts {
		n, ok := ipv4Number(p)
		if !ok {
			return netip.Addr{}, false
		}
		nums = append(nums, n)
	}
	last := nums[len(nums)-1]
	if last >= 1<<(8*(5-len(nums))) {
		return netip.Addr{}, false
	}
	v := last
	for i, n := range nums[:len(nums)-1] {
		if n > 255 {
			return netip.Addr{}, false
		}
		v += n << (8 * (3 - i))
	}
	return netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)}), true
}

// endsInNumber reports whether the last label of host is a number, which
// makes a WHATWG URL parser read host as an IPv4 address.
func endsInNumber(host string) bool {
	labels := strings.Split(host, ".")
	last := labels[len(labels)-1]
	if last == "" {
		return false
	}
	if strings.Trim(last, "0123456789") == "" {
		return true
	}
	_, ok := ipv4Number(last)
	return ok
}

// ipv4Number parses one part of an IPv4 address as a WHATWG URL parser
// does: 0x and hexadecimal, 0 and octal, or decimal.
func ipv4Number(s string) (uint64, bool) {
	base := 10
	switch {
	case s == "":
		return 0, false
	case len(s) >= 2 && (s[:2] == "0x" || s[:2] == "0X"):
		s, base = s[2:], 16
		if s == "" {
			return 0, true
		}
	case len(s) >= 2 && s[0] == '0':
		s, base = s[1:], 8
	}
	n, err := strconv.ParseUint(s, base, 64)
	return n, err == nil
}

// embedded returns the IPv4 address an IPv6 address carries to an IPv4
// network: through NAT64 (64:ff9b::/96) or 6to4 (2002::/16).
func embedded(a netip.Addr) (netip.Addr, bool) {
	if !a.Is6() {
		return netip.Addr{}, false
	}
	b := a.As16()
	switch {
	case nat64.Contains(a):
		return netip.AddrFrom4([4]byte{b[12], b[13], b[14], b[15]}), true
	case sixToFour.Contains(a):
		return netip.AddrFrom4([4]byte{b[2], b[3], b[4], b[5]}), true
	}
	return netip.Addr{}, false
}

var (
	nat64     = netip.MustParsePrefix("64:ff9b::/96")
	sixToFour = netip.MustParsePrefix("2002::/16")
)
