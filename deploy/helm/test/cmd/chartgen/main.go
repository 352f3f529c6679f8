// Command chartgen writes the derived parts of deploy/helm/turnstile: the
// $defs of values.schema.json and the values table of README.md (package
// chartgen says from what). Run it from deploy/helm/test: go generate.
package main

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/turnstile-dev/turnstile/deploy/helm/test/internal/chartgen"
)

func main() {
	if err := run("../turnstile", "../../../config/turnstile.schema.json"); err != nil {
		fmt.Fprintln(os.Stderr, "chartgen:", err)
		os.Exit(1)
	}
}

// run regenerates the chart's schema and README in the directory chart,
// from the server's schema at configSchema.
func run(chart, configSchema string) error {
	files := map[string][]byte{}
	for _, name := range []string{filepath.Join(chart, "values.schema.json"), filepath.Join(chart, "README.md"), filepath.Join(chart, "values.yaml"), configSchema} {
		b, err := os.ReadFile(name)
		if err != nil {
			return err
		}
		files[name] = b
	}
	schemaFile, readmeFile := filepath.Join(chart, "values.schema.json"), filepath.Join(chart, "README.md")
	schema, err := chartgen.Schema(files[schemaFile], files[configSchema])
	if err != nil {
		return err
	}
	readme, err := chartgen.README(files[readmeFile], schema, files[filepath.Join(chart, "values.yaml")])
	if err != nil {
		return err
	}
	if err := os.WriteFile(schemaFile, schema, 0o644); err != nil {
		return err
	}
	return os.WriteFile(readmeFile, readme, 0o644)
}
