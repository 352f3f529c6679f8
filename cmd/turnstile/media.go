package main

import (
	"fmt"
	"os"
	"strings"

	"github.com/turnstile-dev/turnstile/client"
	turnstilev1 "github.com/turnstile-dev/turnstile/gen/turnstile/v1"
)

// mediaFlag collects the files of run's --image and --file flags, in the
// order given.
type mediaFlag struct {
	files []mediaFile
}

// mediaFile is one file to send; image says it came from --image.
type mediaFile struct {
	path  string
	image bool
}

// mediaValue is one of the flags filling a mediaFlag.
type mediaValue struct {
	m     *mediaFlag
	image bool
}

func (f *mediaFlag) image() *mediaValue { return &mediaValue{m: f, image: true} }
func (f *mediaFlag) file() *mediaValue  { return &mediaValue{m: f} }

func (v *mediaValue) String() string { return "" }

func (v *mediaValue) Set(path string) error {
	if path == "" {
		return fmt.Errorf("a file is required")
	}
	v.m.files = append(v.m.files, mediaFile{path: path, image: v.image})
	return nil
}

// parts reads the files into media parts, their types from their
// extensions or contents; the server checks the types and sizes it takes.
func (f *mediaFlag) parts() ([]*turnstilev1.Part, error) {
	var out []*turnstilev1.Part
	for _, mf := range f.files {
		flag := "--file"
		if mf.image {
			flag = "--image"
		}
		data, err := os.ReadFile(mf.path)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", flag, err)
		}
		mime := client.MediaType(mf.path, data)
		if mf.image && !strings.HasPrefix(mime, "image/") {
			return nil, fmt.Errorf("--image %s: not an image (%s); use --file for documents and audio", mf.path, mime)
		}
		out = append(out, client.MediaPart(data, mime, mf.path))
	}
	return out, nil
}
