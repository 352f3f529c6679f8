package server

import (
	"context"

	middleware "github.com/grpc-ecosystem/go-grpc-middleware/v2"
	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors"
	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/auth"
	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/logging"
	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/selector"
	"google.golang.org/grpc"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	turnstilev1 "github.com/turnstile-dev/turnstile/gen/turnstile/v1"
	"github.com/turnstile-dev/turnstile/server/admission"
)

// authenticate is the [auth.AuthFunc]: it finds the key whose token the
// request carries in "authorization: Bearer <token>", and puts it in the
// context and its name on the RPC's log line.
func authenticate(keys *admission.Keys) auth.AuthFunc {
	return func(ctx context.Context) (context.Context, error) {
		token, err := auth.AuthFromMD(ctx, "bearer")
		if err != nil {
			return nil, unauthenticated("missing client key: send the metadata \"authorization: Bearer <token>\"").Err()
		}
		k := keys.Find(token)
		if k == nil {
			return nil, unauthenticated("invalid client key").Err()
		}
		logging.AddFields(ctx, logging.Fields{"client", k.Name})
		return admission.NewContext(ctx, k), nil
	}
}

// requireKey returns the interceptors that require a key on every RPC but
// the health service's, which load balancers call without one.
func requireKey(keys *admission.Keys) (grpc.UnaryServerInterceptor, grpc.StreamServerInterceptor) {
	notHealth := selector.MatchFunc(func(_ context.Context, c interceptors.CallMeta) bool {
		return c.Service != healthpb.Health_ServiceDesc.ServiceName
	})
	return selector.UnaryServerInterceptor(auth.UnaryServerInterceptor(authenticate(keys)), notHealth),
		selector.StreamServerInterceptor(auth.StreamServerInterceptor(authenticate(keys)), notHealth)
}

// admit is the stream interceptor that starts RunTurn calls only within
// the server's bound on turns, its memory (a key at its share refused
// first: admission.Memory) and the caller's key limits; a turn refused
// gets RESOURCE_EXHAUSTED with ErrorInfo LIMIT_EXCEEDED (or
// BUDGET_EXHAUSTED, and RetryInfo when waiting helps) before its request
// is read; a turn refused while the memory the process holds is past the
// last mark sheds the unread turns of the key that runs the most first
// (shed). Each refusal is counted (refuse). The slots it takes are the call's, freed when it returns,
// unless the handler keeps them for a turn that outlives the call
// (admission.SlotsFrom).
func admit(gate *admission.Gate, memory *admission.Memory, shed func(client string) int, refuse func(err error, client string) *status.Status) grpc.StreamServerInterceptor {
	runTurn := "/" + turnstilev1.AgentService_ServiceDesc.ServiceName + "/RunTurn"
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		if info.FullMethod != runTurn {
			return handler(srv, ss)
		}
		k := admission.FromContext(ss.Context())
		leave, err := gate.Enter()
		if err != nil {
			return refuse(err, k.KeyName()).Err()
		}
		held := admission.NewSlots(leave)
		defer held.CallEnded()
		out, err := memory.Enter(k.KeyName())
		if err != nil {
			// Past the last mark, the turns nobody reads of the key that
			// runs the most are ended, so that a retry finds room.
			if heaviest, over := memory.Heaviest(); over {
				shed(heaviest)
			}
			return refuse(err, k.KeyName()).Err()
		}
		held.Add(out)
		end, err := k.Admit()
		if err != nil {
			return refuse(err, k.KeyName()).Err()
		}
		held.Add(end)
		w := middleware.WrapServerStream(ss)
		w.WrappedContext = admission.WithSlots(ss.Context(), held)
		return handler(srv, w)
	}
}
