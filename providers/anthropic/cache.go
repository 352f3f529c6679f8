package anthropic

import "github.com/anthropics/anthropic-sdk-go"

// Anthropic caches a prompt only up to the cache_control breakpoints a
// request sets, at most four of them, and reads a cached prefix only when
// a later request sets a breakpoint at or after its end (looking back at
// most 20 blocks from each breakpoint for an earlier entry).
// setCacheBreakpoints spends the four on the prefix that the next
// requests of the same conversation repeat:
//
//  1. the last tool: the tool definitions, which change least;
//  2. the system prompt's last block: tools and system together;
//  3. the last block of the newest message: this request's whole prompt
//     is written to the cache, so the turn's next step (which only appends
//     the reply and its tool results) reads all of it;
//  4. the last block of the message two before the newest: where the
//     previous request of the conversation ended. Within a turn the
//     previous step sent everything before [assistant's tool calls, tool
//     results]; in a new turn the previous turn's last call sent
//     everything before [its final reply, the new user message]. Either
//     way that request wrote its cache entry there (its breakpoint 3), so
//     this one reads it even when more than 20 blocks were added since.
//
// Breakpoints go on blocks that accept cache_control (not thinking
// blocks: the last other block of the message is used). A prefix shorter
// than the model's minimum cacheable length is simply not cached; the
// marks cost nothing then.
func setCacheBreakpoints(params *anthropic.MessageNewParams) {
	if n := len(params.Tools); n > 0 {
		if t := params.Tools[n-1].OfTool; t != nil {
			t.CacheControl = anthropic.NewCacheControlEphemeralParam()
		}
	}
	if n := len(params.System); n > 0 {
		params.System[n-1].CacheControl = anthropic.NewCacheControlEphemeralParam()
	}
	n := len(params.Messages)
	if n > 0 {
		markLastBlock(params.Messages[n-1].Content)
	}
	if n > 2 {
		markLastBlock(params.Messages[n-3].Content)
	}
}

// markLastBlock sets an ephemeral cache breakpoint on the last block of
// content that takes one.
func markLastBlock(content []anthropic.ContentBlockParamUnion) {
	for i := len(content) - 1; i >= 0; i-- {
		if cc := content[i].GetCacheControl(); cc != nil {
			*cc = anthropic.NewCacheControlEphemeralParam()
			return
		}
	}
}
