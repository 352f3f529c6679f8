package runtime_test

import (
	"strings"
	"testing"

	"github.com/turnstile-dev/turnstile/runtime"
)

// TestRefusedMediaHosts: a media URI is refused when its host is one the
// rules name: an IP address by network, in every form a URL parser reads
// as an address, a name by name (nothing is resolved).
func TestRefusedMediaHosts(t *testing.T) {
	defaults, problems := runtime.ParseHostRules(runtime.DefaultRefusedMediaHosts())
	if len(problems) > 0 {
		t.Fatal(problems)
	}
	custom, problems := runtime.ParseHostRules([]string{"10.1.0.0/16", "203.0.113.7", "2001:db8::/32", "files.corp.example", "*.internal"})
	if len(problems) > 0 {
		t.Fatal(problems)
	}
	none, _ := runtime.ParseHostRules([]string{})
	tests := []struct {
		rules *runtime.HostRules
		uri   string
		want  string // the entry that refuses it; "invalid" for no valid host, "not a URI"; "" when taken
	}{
		{defaults, "https://example.com/a.png", ""},
		{defaults, "https://8.8.8.8/a.png", ""},
		{defaults, "https://[2001:db8::1]/a.png", ""},
		{defaults, "https://bücher.example/a.png", ""},
		{defaults, "https://127.0.0.1/a.png", "loopback"},
		{defaults, "https://127.0.0.1:8443/a.png", "loopback"},
		{defaults, "https://[::1]/a.png", "loopback"},
		{defaults, "https://localhost/a.png", "loopback"},
		{defaults, "https://LocalHost./a.png", "loopback"},
		{defaults, "https://api.localhost/a.png", "loopback"},
		{defaults, "https://169.254.169.254/latest/meta-data", "link_local"},
		{defaults, "https://[fe80::1%25eth0]/a.png", "link_local"},
		{defaults, "https://10.1.2.3/a.png", "private"},
		{defaults, "https://172.31.0.1/a.png", "private"},
		{defaults, "https://192.168.1.1/a.png", "private"},
		{defaults, "https://100.100.100.200/latest/meta-data", "private"},
		{defaults, "https://[fd00:ec2::254]/latest/meta-data", "private"},
		{defaults, "https://0.0.0.0/a.png", "unspecified"},
		{defaults, "https://[::]/a.png", "unspecified"},
		// An IPv4 address in the other forms URL parsers read.
		{defaults, "https://2130706433/a.png", "loopback"},
		{defaults, "https://0x7f.1/a.png", "loopback"},
		{defaults, "https://0177.0.0.1/a.png", "loopback"},
		{defaults, "https://127.1/a.png", "loopback"},
		{defaults, "https://0xA9FEA9FE/latest", "link_local"},
		// Go's parser takes no escape in a host: the URI is refused.
		{defaults, "https://%31%32%37.0.0.1/a.png", "not a URI"},
		{defaults, "https://１２７.０.０.１/a.png", "loopback"},
		{defaults, "https://[::ffff:169.254.169.254]/latest", "link_local"},
		{defaults, "https://[64:ff9b::a9fe:a9fe]/latest", "link_local"},
		{defaults, "https://[2002:7f00:1::]/a.png", "loopback"},
		// What a parser refuses as a host.
		{defaults, "https://1.2.3.4.5/a.png", "invalid"},
		{defaults, "https://256.1.1.1/a.png", "invalid"},
		{defaults, "https://example.08/a.png", "invalid"},
		// Names are matched by name only.
		{defaults, "https://metadata.google.internal/computeMetadata", ""},
		{custom, "https://metadata.google.internal/computeMetadata", "*.internal"},
		{custom, "https://internal/a.png", ""},
		{custom, "https://FILES.corp.example/a.png", "files.corp.example"},
		{custom, "https://x.files.corp.example/a.png", ""},
		{custom, "https://10.1.255.1/a.png", "10.1.0.0/16"},
		{custom, "https://10.2.0.1/a.png", ""},
		{custom, "https://203.0.113.7/a.png", "203.0.113.7"},
		{custom, "https://[2001:db8::1]/a.png", "2001:db8::/32"},
		{custom, "https://127.0.0.1/a.png", ""},
		{none, "https://127.0.0.1/a.png", ""},
		{nil, "https://127.0.0.1/a.png", ""},
	}
	for _, tt := range tests {
		got := tt.rules.Refused(tt.uri)
		switch {
		case tt.want == "" && got != "":
			t.Errorf("Refused(%s) = %q, want it taken", tt.uri, got)
		case tt.want == "invalid" && !strings.HasPrefix(got, "names no valid host"):
			t.Errorf("Refused(%s) = %q, want no valid host", tt.uri, got)
		case tt.want == "not a URI" && got != "is not a URI":
			t.Errorf("Refused(%s) = %q, want no URI", tt.uri, got)
		case tt.want != "" && tt.want != "invalid" && tt.want != "not a URI" && got != "names a host this server does not pass on (refused: "+tt.want+")":
			t.Errorf("Refused(%s) = %q, want it refused by %s", tt.uri, got, tt.want)
		}
	}
}

// TestParseHostRules names each entry that is none of the forms.
func TestParseHostRules(t *testing.T) {
	_, problems := runtime.ParseHostRules([]string{"loopback", "", "10.0.0.0/33", "*.", "https://x.example", "ok.example", "a b"})
	var fields []string
	for _, p := range problems {
		fields = append(fields, p.Field)
		if !strings.Contains(p.Message, "is not loopback, private, link_local, unspecified, a network, an IP address, a host name or *.DOMAIN") {
			t.Errorf("%s: %s", p.Field, p.Message)
		}
	}
	if got := strings.Join(fields, ","); got != "[1],[2],[3],[4],[6]" {
		t.Errorf("problems at %s, want [1],[2],[3],[4],[6]", got)
	}
}
