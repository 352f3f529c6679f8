package server

import (
	"errors"
	"strings"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/encoding"
	protoenc "google.golang.org/grpc/encoding/proto"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	turnstilev1 "github.com/turnstile-dev/turnstile/gen/turnstile/v1"
	"github.com/turnstile-dev/turnstile/runtime"
)

// grpc-go turns any failure of the codec's Unmarshal into INTERNAL ("failed
// to unmarshal the received message"), which the contract reserves for
// bugs, and writes that status itself before the handler returns. A
// request that is not valid protobuf, or whose strings are not valid UTF-8,
// is the client's error: INVALID_ARGUMENT. So the server uses its own
// codec (the proto codec, unchanged on the wire) and the stream interceptor
// [decodeErrors] hands it a [decodeTarget]: the codec records its failure
// there instead of returning it, and the interceptor answers from the
// record. Unary methods (health) decode before any interceptor runs and
// keep grpc-go's answer. A request over the size limit never reaches the
// codec: grpc-go refuses it as soon as it reads its length, with
// RESOURCE_EXHAUSTED.

// decodeTarget is the message a stream's RecvMsg decodes into, with room
// for the codec's failure. It embeds the message, so it is a proto.Message
// itself for stats handlers that look at received payloads.
type decodeTarget struct {
	proto.Message
	err error
}

// codec is the proto codec, noting its unmarshal failures in a
// *decodeTarget.
type codec struct{ base encoding.CodecV2 }

func newCodec() codec { return codec{base: encoding.GetCodecV2(protoenc.Name)} }

// Name implements [encoding.CodecV2].
func (c codec) Name() string { return c.base.Name() }

// Marshal implements [encoding.CodecV2].
func (c codec) Marshal(v any) (mem.BufferSlice, error) {
	if t, ok := v.(*decodeTarget); ok {
		v = t.Message
	}
	return c.base.Marshal(v)
}

// Unmarshal implements [encoding.CodecV2]. Decoding into a *decodeTarget
// never fails: the failure is recorded in the target. A RunTurnRequest
// with too many items ([countItems]) is refused before it is decoded.
func (c codec) Unmarshal(data mem.BufferSlice, v any) error {
	t, ok := v.(*decodeTarget)
	if !ok {
		return c.base.Unmarshal(data, v)
	}
	if _, isRequest := t.Message.(*turnstilev1.RunTurnRequest); !isRequest {
		t.err = c.base.Unmarshal(data, t.Message)
		return nil
	}
	buf := data.MaterializeToBuffer(mem.DefaultBufferPool())
	defer buf.Free()
	if fe := countItems(buf.ReadOnlyData()); fe != nil {
		t.err = fe
		return nil
	}
	t.err = proto.Unmarshal(buf.ReadOnlyData(), t.Message)
	return nil
}

// decodeErrors is the stream interceptor that answers a request that does
// not decode with INVALID_ARGUMENT and ErrorInfo.
func decodeErrors(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	return handler(srv, &decodingStream{ServerStream: ss})
}

type decodingStream struct{ grpc.ServerStream }

// RecvMsg implements [grpc.ServerStream].
func (s *decodingStream) RecvMsg(m any) error {
	pm, ok := m.(proto.Message)
	if !ok {
		return s.ServerStream.RecvMsg(m)
	}
	t := &decodeTarget{Message: pm}
	if err := s.ServerStream.RecvMsg(t); err != nil {
		return err
	}
	if t.err != nil {
		return malformedRequest(t.err).Err()
	}
	return nil
}

// malformedRequest is the status of a request that is not a valid message:
// broken wire format, or a string that is not UTF-8.
func malformedRequest(err error) *status.Status {
	var fe *runtime.FieldError
	if errors.As(err, &fe) {
		return invalidArgument(violations{fe})
	}
	msg := "the request is not a valid protobuf message"
	if strings.Contains(strings.ToLower(err.Error()), "utf-8") {
		msg = "the request holds a string that is not valid UTF-8"
	}
	return withDetails(status.New(codes.InvalidArgument, msg+": "+clip(err.Error(), 200)),
		errorInfo(reasonInvalidRequest, map[string]string{"cause": "decode"}))
}
