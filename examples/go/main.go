// Command go runs one turn on a turnstile server (TURNSTILE_ADDR, default
// 127.0.0.1:7700) with the Go client and prints its reply as it streams.
package main

import (
	"context"
	"fmt"
	"os"
	"strings"

	"github.com/turnstile-dev/turnstile/client"
	turnstilev1 "github.com/turnstile-dev/turnstile/gen/turnstile/v1"
)

func main() {
	addr := os.Getenv("TURNSTILE_ADDR")
	if addr == "" {
		addr = "127.0.0.1:7700"
	}
	c, err := client.New(addr, client.WithInsecure())
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	defer c.Close()
	prompt := strings.Join(os.Args[1:], " ")
	turn := c.RunTurn(context.Background(), &turnstilev1.RunTurnRequest{Messages: []*turnstilev1.Message{{
		Role: turnstilev1.Role_ROLE_USER, Parts: []*turnstilev1.Part{{Kind: &turnstilev1.Part_Text{Text: prompt}}},
	}}})
	for ev, err := range turn.Events() {
		switch {
		case err != nil:
			fmt.Fprintln(os.Stderr, "\n"+err.Error())
			os.Exit(1)
		case ev.StepRetry != nil:
			fmt.Printf("\n[retrying: %s]\n", client.CodeName(ev.StepRetry.Err.Code))
		default:
			fmt.Print(ev.Agent.GetTextDelta().GetText())
		}
	}
	fmt.Printf("\n%s\n", turn.Result().EndReason)
}
