package server

import (
	"context"
	"errors"
	"strings"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/encoding"
	protoenc "google.golang.org/grpc/encoding/proto"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	turnstilev1 "github.com/turnstile-dev/turnstile/gen/turnstile/v1"
	"github.com/turnstile-dev/turnstile/runtime"
	"github.com/turnstile-dev/turnstile/server/wire"
)

// grpc-go turns any failure of the codec's Unmarshal into INTERNAL ("failed
// to unmarshal the received message"), which the contract reserves for
// bugs. A request that is not valid protobuf, or whose strings are not
// valid UTF-8, is the client's error: INVALID_ARGUMENT. So the server uses
// its own codec (the proto codec, unchanged on the wire) and hands it a
// [decodeTarget]: the codec records its failure there instead of returning
// it, and the server answers from the record. Streaming methods (RunTurn,
// WatchTurn, health's Watch, reflection) decode in RecvMsg, which the
// stream interceptor [decodeErrors] wraps. A unary method (CancelTurn,
// health's Check) decodes before any unary interceptor runs, inside the
// handler generated for it, so [registrar] wraps that handler: its decode
// records the failure, and the interceptors (the log line, the key check)
// run as for any call, around a handler that answers with it.
//
// A request over the size limit is refused with RESOURCE_EXHAUSTED and
// ErrorInfo REQUEST_TOO_LARGE naming the limit ([requestTooLarge]), by the
// codec, which sees its length. grpc-go's own limit cannot carry that
// ErrorInfo: it writes its detail-less status itself, from inside RecvMsg,
// as soon as it reads a message's length. So grpc-go's limit is set above
// the server's, at [hardRequestLimit]: a request up to that is read and
// refused here, with details; a larger one is refused by grpc-go at once,
// without reading it, and without details.

// decodeTarget is the message a stream's RecvMsg decodes into, with room
// for the codec's failure. It embeds the message, so it is a proto.Message
// itself for stats handlers that look at received payloads.
type decodeTarget struct {
	proto.Message
	err error
}

// codec is the proto codec, noting its unmarshal failures, and requests
// over maxRequestBytes, in a *decodeTarget.
type codec struct {
	base            encoding.CodecV2
	maxRequestBytes int
}

func newCodec(maxRequestBytes int) codec {
	return codec{base: encoding.GetCodecV2(protoenc.Name), maxRequestBytes: maxRequestBytes}
}

// errTooLarge is the failure of a request over max_request_bytes.
var errTooLarge = errors.New("the request is too large")

// hardRequestLimit is the receive limit given to grpc-go for a server
// that accepts requests of maxRequestBytes: twice that, or 1 MiB more,
// whichever is less. Up to it, a request too large is read and refused
// with details; beyond it, grpc-go refuses it before reading it.
func hardRequestLimit(maxRequestBytes int) int {
	return maxRequestBytes + min(maxRequestBytes, 1<<20)
}

// Name implements [encoding.CodecV2].
func (c codec) Name() string { return c.base.Name() }

// encodedResponse is a response (RunTurnResponse, WatchTurnResponse)
// whose one field, its event (field 1), is already encoded: the codec
// writes the field's tag and length before event's bytes, with no second
// encoding of the event, and nothing decodes it on the way. It is a
// proto.Message itself (ProtoReflect) for stats handlers that look at
// sent payloads.
type encodedResponse struct {
	// typ is the response's type.
	typ   protoreflect.MessageType
	event []byte
}

// The types of the responses an [encodedResponse] stands for.
var (
	runTurnResponseType   = (*turnstilev1.RunTurnResponse)(nil).ProtoReflect().Type()
	watchTurnResponseType = (*turnstilev1.WatchTurnResponse)(nil).ProtoReflect().Type()
)

// ProtoReflect implements [proto.Message]: the response decoded from its
// wire form, anew at each call, for a stats handler that reads the payload
// sent (grpc.StatsHandler's OutPayload; otelgrpc, the server's own, reads
// only its lengths). Sending it never calls it: a run's window holds its
// events as wire forms only (server/durable), and this decodes one only
// for whoever asks. An event that does not decode (never one stored by
// this server) leaves the response without it.
func (e *encodedResponse) ProtoReflect() protoreflect.Message {
	m := e.typ.New()
	b := protowire.AppendBytes(protowire.AppendTag(make([]byte, 0, wire.ResponseSize(len(e.event))), 1, protowire.BytesType), e.event)
	if err := proto.Unmarshal(b, m.Interface()); err != nil {
		return e.typ.New()
	}
	return m
}

// Marshal implements [encoding.CodecV2]. It encodes as gRPC's proto codec
// does, but a message large enough to be pooled goes into a buffer of the
// server's [bufferPool]: gRPC's codec takes gRPC's default pool, whose
// tiers jump from 32 KiB to 1 MiB, so an event of 40 KiB waiting in a slow
// client's queue (a long reply's message_completed or turn_completed) held
// 1 MiB. An [encodedResponse] is its event's bytes behind their field's
// tag and length, shared, not copied, once large enough to be pooled.
func (c codec) Marshal(v any) (mem.BufferSlice, error) {
	if e, ok := v.(*encodedResponse); ok {
		return e.marshal(), nil
	}
	if t, ok := v.(*decodeTarget); ok {
		v = t.Message
	}
	m, ok := v.(proto.Message)
	if !ok {
		return c.base.Marshal(v)
	}
	size := proto.Size(m)
	if mem.IsBelowBufferPoolingThreshold(size) {
		return c.base.Marshal(m)
	}
	buf := bufferPool.Get(size)
	// The size was just computed, and a message is not changed while it
	// is sent.
	if _, err := (proto.MarshalOptions{UseCachedSize: true}).MarshalAppend((*buf)[:0], m); err != nil {
		bufferPool.Put(buf)
		return nil, err
	}
	return mem.BufferSlice{mem.NewBuffer(buf, bufferPool)}, nil
}

// Unmarshal implements [encoding.CodecV2]. Decoding into a *decodeTarget
// never fails: the failure is recorded in the target. A request over
// maxRequestBytes, and a RunTurnRequest with too many items
// ([countItems]), are refused before they are decoded.
func (c codec) Unmarshal(data mem.BufferSlice, v any) error {
	t, ok := v.(*decodeTarget)
	if !ok {
		return c.base.Unmarshal(data, v)
	}
	if c.maxRequestBytes > 0 && data.Len() > c.maxRequestBytes {
		t.err = errTooLarge
		return nil
	}
	if _, isRequest := t.Message.(*turnstilev1.RunTurnRequest); !isRequest {
		t.err = c.base.Unmarshal(data, t.Message)
		return nil
	}
	buf := data.MaterializeToBuffer(mem.DefaultBufferPool())
	defer buf.Free()
	if fe := wire.CountItems(buf.ReadOnlyData()); fe != nil {
		t.err = fe
		return nil
	}
	t.err = proto.Unmarshal(buf.ReadOnlyData(), t.Message)
	return nil
}

// decodeErrors returns the stream interceptor that answers a request that
// does not decode with INVALID_ARGUMENT and ErrorInfo, and one over
// maxRequestBytes with [requestTooLarge].
func decodeErrors(maxRequestBytes int) grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		return handler(srv, &decodingStream{ServerStream: ss, maxRequestBytes: maxRequestBytes})
	}
}

type decodingStream struct {
	grpc.ServerStream
	maxRequestBytes int
}

// RecvMsg implements [grpc.ServerStream].
func (s *decodingStream) RecvMsg(m any) error {
	refused, err := decode(s.ServerStream.RecvMsg, m, s.maxRequestBytes)
	if refused != nil {
		return refused
	}
	return err
}

// decode calls recv, a stream's RecvMsg or a unary method's decoder, with
// m wrapped in a [decodeTarget]. It returns as refused the status error of
// a request that did not decode or was over maxRequestBytes, and as err
// recv's own errors (io.EOF, a cancelled stream, grpc-go's refusal of a
// request over [hardRequestLimit]) as they are.
func decode(recv func(any) error, m any, maxRequestBytes int) (refused, err error) {
	pm, ok := m.(proto.Message)
	if !ok {
		return nil, recv(m)
	}
	t := &decodeTarget{Message: pm}
	if err := recv(t); err != nil {
		return nil, err
	}
	switch {
	case errors.Is(t.err, errTooLarge):
		return requestTooLarge(maxRequestBytes).Err(), nil
	case t.err != nil:
		return malformedRequest(t.err).Err(), nil
	}
	return nil, nil
}

// registrar registers services on a grpc.Server with their unary methods'
// handlers wrapped by [decodingHandler]. Register every service through
// it (reflection included: it needs GetServiceInfo, which the embedded
// server provides).
type registrar struct {
	*grpc.Server
	maxRequestBytes int
}

// RegisterService implements [grpc.ServiceRegistrar].
func (r registrar) RegisterService(desc *grpc.ServiceDesc, impl any) {
	d := *desc
	d.Methods = make([]grpc.MethodDesc, len(desc.Methods))
	for i, m := range desc.Methods {
		m.Handler = decodingHandler(m.Handler, r.maxRequestBytes)
		d.Methods[i] = m
	}
	r.Server.RegisterService(&d, impl)
}

// decodingHandler wraps the generated handler of a unary method, which
// decodes the request and returns at once when that fails, before any
// interceptor. The wrapped decoder never fails: it keeps the status of a
// request that did not decode (see [decode]), and the interceptors then
// run around a handler that returns it instead of calling the method.
func decodingHandler(h grpc.MethodHandler, maxRequestBytes int) grpc.MethodHandler {
	return func(srv any, ctx context.Context, dec func(any) error, next grpc.UnaryServerInterceptor) (any, error) {
		var failed error
		decodeOnce := func(m any) error {
			refused, err := decode(dec, m, maxRequestBytes)
			failed = refused
			return err
		}
		intercept := func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
			if failed != nil {
				handler = func(context.Context, any) (any, error) { return nil, failed }
			}
			if next == nil {
				return handler(ctx, req)
			}
			return next(ctx, req, info, handler)
		}
		return h(srv, ctx, decodeOnce, intercept)
	}
}

// malformedRequest is the status of a request that is not a valid message:
// broken wire format, or a string that is not UTF-8.
func malformedRequest(err error) *status.Status {
	var fe *runtime.FieldError
	if errors.As(err, &fe) {
		return invalidArgument([]*runtime.FieldError{fe})
	}
	msg := "the request is not a valid protobuf message"
	if strings.Contains(strings.ToLower(err.Error()), "utf-8") {
		msg = "the request holds a string that is not valid UTF-8"
	}
	return withDetails(status.New(codes.InvalidArgument, msg+": "+wire.Clip(err.Error(), 200)),
		errorInfo(reasonInvalidRequest, map[string]string{"cause": "decode"}))
}

// marshal returns e's wire form: field 1, its event, as bytes. A small
// response is one buffer of its own. A larger one is its field's tag and
// length, then the event's bytes themselves, not a copy of them: gRPC
// queues the message until the client's flow-control window takes it,
// and a stream that does not read (a durable run's window holds the same
// bytes, which the log was sent) would otherwise hold each event twice.
// The bytes are never changed once encoded (the run's window and the
// log's reads hand over bytes of their own), so gRPC may hold them for as
// long as it needs; SliceBuffer's Free leaves them to the collector.
func (e *encodedResponse) marshal() mem.BufferSlice {
	size := wire.ResponseSize(len(e.event))
	if mem.IsBelowBufferPoolingThreshold(size) {
		b := make([]byte, 0, size)
		return mem.BufferSlice{mem.SliceBuffer(protowire.AppendBytes(protowire.AppendTag(b, 1, protowire.BytesType), e.event))}
	}
	head := make([]byte, 0, size-len(e.event))
	head = protowire.AppendVarint(protowire.AppendTag(head, 1, protowire.BytesType), uint64(len(e.event)))
	return mem.BufferSlice{mem.SliceBuffer(head), mem.SliceBuffer(e.event)}
}
