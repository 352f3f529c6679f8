package main

import "testing"

func TestGCSettings(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name      string
		env       map[string]string
		memoryMax string
		gogc      int
		limit     int64
	}{
		{"nothing set, no container limit", nil, "max\n", defaultGOGC, 0},
		{"nothing set, no cgroup", nil, "", defaultGOGC, 0},
		{"container limit", nil, "1073741824\n", defaultGOGC, 966367641},
		{"operator's GOGC", map[string]string{"GOGC": "100"}, "1073741824\n", 0, 966367641},
		{"operator's GOMEMLIMIT", map[string]string{"GOMEMLIMIT": "512MiB"}, "1073741824\n", defaultGOGC, 0},
		{"operator's both", map[string]string{"GOGC": "off", "GOMEMLIMIT": "1GiB"}, "1073741824\n", 0, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			gogc, limit := gcSettings(func(k string) string { return tt.env[k] }, tt.memoryMax)
			if gogc != tt.gogc || limit != tt.limit {
				t.Errorf("gcSettings = %d, %d, want %d, %d", gogc, limit, tt.gogc, tt.limit)
			}
		})
	}
}
