package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	turnstilev1 "github.com/turnstile-dev/turnstile/gen/turnstile/v1"
	"github.com/turnstile-dev/turnstile/internal/natstest"
	"github.com/turnstile-dev/turnstile/internal/wiretest"
)

// budgetTurn runs one turn of the key of token on c and returns the cost
// the turn reported (in nanos; 0 when none) and its status.
func budgetTurn(ctx context.Context, c turnstilev1.AgentServiceClient, token, id string) (nanos int64, st *status.Status) {
	ctx = metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+token)
	stream, err := c.RunTurn(ctx, &turnstilev1.RunTurnRequest{TurnId: id, Messages: wiretest.UserText("what does the budget cover?")})
	if err != nil {
		return 0, status.Convert(err)
	}
	for {
		resp, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return nanos, status.New(codes.OK, "")
		}
		if err != nil {
			return nanos, status.Convert(err)
		}
		if u := resp.GetEvent().GetUsage(); u != nil {
			nanos = u.GetCost().GetUnits()*1e9 + int64(u.GetCost().GetNanos())
		}
	}
}

// TestSharedBudgetAcrossReplicas is the proof of a key's daily budget
// across three `turnstile serve` replicas on one NATS: four clients per
// replica run the key's turns until every one of them is refused
// BUDGET_EXHAUSTED (retrying at once while the running turns hold the
// rest: LIMIT_EXCEEDED). Each turn holds what its call may cost until it
// reports it, and the replicas share their holds: what the key spent in
// all is within the measured overshoot, what the replicas admitted while
// the last hold travelled, well under the three budgets the replicas
// would let through keeping it alone. It logs the figures
// docs/security.md states.
func TestSharedBudgetAcrossReplicas(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and starts three servers")
	}
	now := time.Now().UTC()
	if next := now.Truncate(24 * time.Hour).Add(24 * time.Hour); next.Sub(now) < time.Minute {
		t.Skip("too near the day's reset")
	}
	bin := turnstileBinary(t)
	url := natstest.Start(t)
	const token = "tok-budget-e2e-0123456789"
	sum := sha256.Sum256([]byte(token))
	dir := t.TempDir()
	config := filepath.Join(dir, "config.yaml")
	if err := os.WriteFile(config, fmt.Appendf(nil, `
providers:
  sim: {type: simulator, token_delay: 1ms}
pricing: {currency: USD}
models:
  sim: {provider: sim, model: turnstile-sim-1, price: {input: 3, output: 15}, max_output_tokens: 100}
auth:
  keys:
    - {name: team, token_sha256: %s, limits: {cost_per_day: "0.01"}}
store:
  mode: nats
  nats: {url: %s}
server: {shutdown_grace: 1s, drain_delay: 0s}
`, hex.EncodeToString(sum[:]), url), 0o600); err != nil {
		t.Fatal(err)
	}
	const budget = 10_000_000 // 0.01 USD in nanos
	var clients []turnstilev1.AgentServiceClient
	for range 3 {
		p := startReplica(t, t, bin, config, freeAddr(t))
		conn, err := grpc.NewClient(p.addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		clients = append(clients, turnstilev1.NewAgentServiceClient(conn))
	}

	const perReplica = 4
	var (
		mu                sync.Mutex
		spent, perTurn    int64
		completed, midway int
		beforeCall        int // admitted, then ended before its first call
		held              int // refused while the key's running turns held the rest
		refusals          = map[string]int{}
		wrong             []string
	)
	var wg sync.WaitGroup
	start := time.Now()
	for r, c := range clients {
		for w := range perReplica {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := 0; ; i++ {
					nanos, st := budgetTurn(t.Context(), c, token, fmt.Sprintf("r%d-w%d-%d", r, w, i))
					mu.Lock()
					spent += nanos
					switch {
					case st.Code() == codes.OK:
						completed++
						perTurn = nanos
					case nanos > 0 && reasonOfStatus(st) == "BUDGET_EXHAUSTED":
						midway++ // crossed before a next call it never made
					case nanos == 0 && reasonOfStatus(st) == "BUDGET_EXHAUSTED" && retryDelay(st) < 0:
						// Admitted while this replica's view was under the
						// budget; what the others spent arrived before the
						// turn's first call.
						beforeCall++
						mu.Unlock()
						return
					case nanos == 0 && reasonOfStatus(st) == "BUDGET_EXHAUSTED":
						refusals[retryDelay(st).String()]++
						mu.Unlock()
						return
					case nanos == 0 && reasonOfStatus(st) == "LIMIT_EXCEEDED" && retryDelay(st) == 0:
						// The running turns hold the rest of the budget
						// (RetryInfo 1s, rounded to the hour): again.
						held++
					default:
						wrong = append(wrong, fmt.Sprintf("%v %s", st.Code(), st.Message()))
						mu.Unlock()
						return
					}
					mu.Unlock()
				}
			}()
		}
	}
	wg.Wait()
	took := time.Since(start)
	if len(wrong) > 0 {
		t.Fatalf("turns ended otherwise: %v", wrong)
	}
	if perTurn == 0 {
		t.Fatal("no turn reported a cost")
	}
	over := spent - budget
	t.Logf("3 replicas × %d clients: %d turns completed (%d nanos each), %d ended mid-way, %d before their first call, %d refused while held, in %s; spent %d nanos of a budget of %d: overshoot %d nanos = %.1f turns = %.0f%% of the budget; refusals by RetryInfo (rounded to the hour) %v",
		perReplica, completed, perTurn, midway, beforeCall, held, took.Round(time.Millisecond), spent, budget, over, float64(over)/float64(perTurn), 100*float64(over)/budget, refusals)
	// A turn is refused for good once what is left does not cover what
	// its call may cost: its prompt and 100 output tokens, under five
	// turns' cost.
	if spent < budget-5*perTurn {
		t.Errorf("refused before the budget was spent: %d < %d less five turns", spent, budget)
	}
	// The bound: what the replicas admit while the last hold travels (a
	// few turns); before holds, the 12 clients' turns in flight at the
	// crossing each finished (9.6 to 11.6 turns over), and keeping the
	// budget alone, the replicas would spend up to three budgets.
	if limit := int64(budget) + 6*perTurn; spent > limit {
		t.Errorf("spent %d nanos, over the bound %d (the budget and 6 turns)", spent, limit)
	}
}

func reasonOfStatus(st *status.Status) string {
	for _, d := range st.Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok {
			return info.GetReason()
		}
	}
	return ""
}

// retryDelay returns the RetryInfo delay of st rounded to the hour (the
// wait until UTC midnight), or -1 without one.
func retryDelay(st *status.Status) time.Duration {
	for _, d := range st.Details() {
		if ri, ok := d.(*errdetails.RetryInfo); ok {
			return ri.GetRetryDelay().AsDuration().Round(time.Hour)
		}
	}
	return -1
}
