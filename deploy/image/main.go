// Command image builds turnstile's container image without a container
// engine and without pulling a base image: the static binary, built as the
// Dockerfile builds it (CGO_ENABLED=0, -trimpath, -ldflags "-s -w -X
// main.version=VERSION"), in one layer with what it needs beside it (the
// CA certificates of Debian's ca-certificates, a non-root user, /tmp), as
// a docker archive (docker load, podman load, crane push) and, with -oci,
// an OCI image layout.
//
//	cd deploy/image
//	go run . -version v1.2.3 -tar /tmp/turnstile.tar
//
// It prints the image's digest, its compressed size and the binary's size.
// With -bin it packs a binary built beforehand, after checking from its
// build information that it was built with exactly the image's flags (CI
// builds the binary its tests run that way, and ships it).
// Run from deploy/image (a module of its own, so that the service's module
// gains no image dependency); -repo names the repository's root.
package main

import (
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
)

func main() {
	if err := run(os.Args[1:], os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "image:", err)
		os.Exit(1)
	}
}

// run parses the flags, builds the image and writes it.
func run(args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("image", flag.ContinueOnError)
	var o options
	fs.StringVar(&o.version, "version", "", "the version stamped into the binary (turnstile version prints it); required")
	prebuilt := fs.String("bin", "", "a turnstile binary already built with the image's flags (checked), instead of building one")
	fs.StringVar(&o.repo, "repo", "../..", "the repository's root, whose ./cmd/turnstile is built")
	fs.StringVar(&o.arch, "arch", "amd64", "the image's architecture (GOARCH)")
	fs.StringVar(&o.caBundle, "ca-certificates", "/etc/ssl/certs/ca-certificates.crt", "the CA bundle to ship (Debian's ca-certificates)")
	fs.Int64Var(&o.epoch, "epoch", 0, "the image's and its files' time, in seconds since 1970 (SOURCE_DATE_EPOCH): the same inputs give the same image")
	tag := fs.String("tag", "", "the docker archive's tag (default turnstile:VERSION)")
	tarPath := fs.String("tar", "", "write a docker archive (docker load, crane push) to this file")
	ociPath := fs.String("oci", "", "write an OCI image layout to this directory")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if o.version == "" {
		return fmt.Errorf("-version is required")
	}
	if *tarPath == "" && *ociPath == "" {
		return fmt.Errorf("-tar or -oci is required")
	}
	if *tag == "" {
		*tag = "turnstile:" + o.version
	}

	work, err := os.MkdirTemp("", "turnstile-image-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(work)
	bin := filepath.Join(work, "turnstile")
	if *prebuilt != "" {
		if err := checkBinary(*prebuilt, o); err != nil {
			return err
		}
		bin = *prebuilt
	} else if err := buildBinary(o, bin); err != nil {
		return err
	}
	img, err := assemble(o, bin)
	if err != nil {
		return err
	}
	if *tarPath != "" {
		if err := writeArchive(*tarPath, *tag, img); err != nil {
			return err
		}
	}
	if *ociPath != "" {
		if err := writeLayout(*ociPath, img); err != nil {
			return err
		}
	}
	digest, err := img.Digest()
	if err != nil {
		return err
	}
	size, err := compressedSize(img)
	if err != nil {
		return err
	}
	fi, err := os.Stat(bin)
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "image %s %s\ncompressed size %d bytes (%.1f MiB); binary %d bytes (%.1f MiB)\n",
		*tag, digest, size, float64(size)/(1<<20), fi.Size(), float64(fi.Size())/(1<<20))
	return nil
}
