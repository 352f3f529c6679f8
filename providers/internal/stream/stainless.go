package stream

import (
	"context"
	"io"
	"iter"
	"net/http"

	"github.com/turnstile-dev/turnstile/llm"
	"github.com/turnstile-dev/turnstile/providers/internal/httpfail"
)

// Reader is the stream reader of the SDKs Stainless generates (the
// ssestream.Stream of openai-go and of anthropic-sdk-go): Next advances to
// the next event, Current returns it, and Err reports the failure that
// stopped Next, nil at a clean end.
type Reader[E any] interface {
	Next() bool
	Current() E
	Err() error
}

// Events returns r's events as an iterator for [Call.Events], with r's
// error, if any, last. It does not close r.
func Events[E any](r Reader[E]) iter.Seq2[E, error] {
	return func(yield func(E, error) bool) {
		for r.Next() {
			if !yield(r.Current(), nil) {
				return
			}
		}
		if err := r.Err(); err != nil {
			var zero E
			yield(zero, err)
		}
	}
}

// SSE returns the [Call] that reads r, the stream of a Stainless SDK's
// call whose HTTP response is resp (nil when none arrived), with dec.
// classify turns the error that ends r into a classified error, given
// resp.
func SSE[E any](r Reader[E], resp *http.Response, dec Decoder[E], classify func(error, *http.Response) *llm.Error) Call[E] {
	return Call[E]{
		Events:   Events(r),
		Decoder:  dec,
		Classify: func(err error) *llm.Error { return classify(err, resp) },
		Response: func() (int, string) {
			code, h := httpfail.Response(resp)
			return code, httpfail.RequestID(h)
		},
	}
}

// Stainless is [Run] for a Stainless SDK's streaming call: newStreaming is
// the service's NewStreaming method, which sends the request mapped by
// build; responseInto is the SDK's option.WithResponseInto, through which
// the HTTP response is kept; consume reads the returned stream, given that
// response (nil when none arrived), usually with [Consume] and [SSE].
// Stainless closes the stream when consume returns.
func Stainless[P, O any, S io.Closer](ctx context.Context, provider string, req *llm.Request,
	build func(*llm.Request) (P, error),
	newStreaming func(context.Context, P, ...O) S,
	responseInto func(**http.Response) O,
	consume func(context.Context, S, *http.Response, func(llm.Chunk, error) bool),
) iter.Seq2[llm.Chunk, error] {
	return Run(provider, req, build, func(params P, yield func(llm.Chunk, error) bool) {
		var resp *http.Response
		s := newStreaming(ctx, params, responseInto(&resp))
		defer s.Close()
		consume(ctx, s, resp, yield)
	})
}
