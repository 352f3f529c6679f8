// Package sim is turnstile's embedded deterministic model, the simulator: the
// default model of a fresh install (no API key, no network) and the model the
// project's tests and demos run on. It implements [llm.Provider] and
// behaves like a real streaming model, so the runtime's retries, fallbacks,
// continuations and compaction can be exercised through it. It imports only
// the standard library and llm.
//
// # Default behaviour
//
// A call answers the last user message (the last [llm.RoleUser] message
// with a text or media part) with a plausible reply of a couple of sentences
// derived from its text; the same text always gets the same reply. Media
// are described at its end, and after the results of tool results that
// carry them: " I received 2 media: image/png of 70 bytes named 'a.png';
// application/pdf by URI." (type, size and name; never the bytes nor the
// URI). It takes every kind of input ([Provider.Inputs]). The reply is
// streamed as [llm.ChunkText] tokens, each a word with the spaces after
// it, each after the provider's token delay (Config.TokenDelay, 15ms by
// default). Then come a [llm.ChunkUsage] (input tokens: the request's
// text bytes / 4, at least 1; output tokens: the tokens streamed, reasoning and
// tool-call argument fragments included) and a [llm.ChunkStop] with
// [llm.StopEndTurn] that names the request's model as the one that served it.
//
// The request's text is the system prompt plus every part's text, signature,
// tool call name and arguments, and tool result content: the size the
// runtime's Compaction events report, plus the system prompt. It sizes the
// input tokens and is what above=BYTES compares against.
//
// A request with an output schema (Request.OutputSchema) is answered, unless
// a directive says otherwise (reply, refuse, tool), with one JSON value the
// schema accepts: every property of an object, the first of an enum, anyOf
// or oneOf, one item of an array (or minItems), 1 for a number, true for a
// boolean, and for a string "sim" (repeated up to minLength). A reply directive
// is sent as it is, so [sim reply="{\"city\":7}"] makes a reply that does
// not match; the runtime's correction that follows (a user message without
// directives) then gets a matching one.
//
// Request.MaxOutputTokens caps the text tokens of every call: a longer reply
// stops after that many with [llm.StopMaxTokens]. When the reply would
// contain one of Request.StopSequences, it stops just before it with
// [llm.StopSequence].
//
// A reply cut short is continued: when the conversation ends with the cut
// assistant text followed by a user message without directives (the
// runtime's continuation prompt), or with the cut assistant text itself (an
// assistant prefill, which [Provider.Capabilities] reports), and
// that text is a strict prefix of the reply the earlier conversation calls
// for, the simulator streams the rest of that reply. Several continuations in
// a row work the same way. Whitespace at the cut does not matter.
//
// Conversations are checked as providers check them: every tool call needs
// exactly one tool result and every result a call; otherwise the call fails
// with [llm.KindInvalidRequest] (400).
//
// When ctx is done the stream stops at once and yields nothing more (not even
// an error: classifying the cancellation is the runtime's job).
//
// # Directives
//
// Directives steer the simulator. They are read from the text of the last
// user message (or, while continuing, from the message that asked) and from
// Config.Script, and are removed from the text the reply is derived from. A
// directive is a bracketed group:
//
//	directive = "[sim" { space option } [ space ] "]"
//	space     = 1*( " " | TAB | CR | LF )
//	option    = key [ "=" value ]
//	key       = 1*( "a"…"z" | "_" )
//	value     = json | bare
//	json      = a JSON string, object or array (may hold spaces and "]")
//	bare      = 1*( any byte but white space and "]" )
//
// "[sim" must be followed by white space or "]"; any other bracket is plain
// text. Text values (think, refuse, reply, message) are bare words or JSON
// strings: reply="two words". Durations are Go durations (500ms, 1.5s) or
// whole seconds (2). Inside a JSON request, as with grpcurl, escape the
// quotes: "text": "[sim tool=current_time args={\"zone\":\"UTC\"}] what time is it?".
//
// Each directive has exactly one action; the options after it refine it:
//
//	fail=CLASS     fail the call (classes below)
//	  times=K        only the first K calls of this request in this turn on
//	                 this model (default: every call)
//	  after=N        stream N tokens first (default 0): reasoning, text or
//	                 argument fragments, whichever the reply starts with
//	  retry_after=D  the provider's Retry-After (rate_limit: default 1s)
//	  above=BYTES    only when the request's text exceeds BYTES
//	  message=TEXT   replace the provider's message
//	  delay=D        wait D before the first token or the failure
//	  model=IDS      only for these provider model ids (comma-separated)
//	tool=NAME      call tool NAME; several tool directives make parallel calls
//	  args=JSON      the arguments, a JSON object (default {})
//	  step=S         call it at model step S of the turn (default 1): after
//	                 the results of step S-1 arrived
//	  delay=D, model=IDS
//	think[=TEXT]   reason first: a reasoning block, then its signature
//	  delay=D, model=IDS
//	refuse[=TEXT]  decline: TEXT (default: a short apology; "" for none),
//	               then StopRefusal
//	  delay=D, model=IDS
//	reply=TEXT     answer TEXT instead of the default reply
//	  delay=D, model=IDS
//	max_tokens=N   stop the reply after N text tokens with StopMaxTokens; the
//	               continuation then completes it (unlike
//	               Request.MaxOutputTokens, which caps every call)
//	  model=IDS
//	delay=D        wait D before the first token
//	  model=IDS
//
// Failure classes and the [llm.Error] each yields, as a real adapter
// would classify the same failure (Kind, StatusCode, Message):
//
//	rate_limit        KindRateLimited     429  RetryAfter (default 1s), HintAfter
//	quota             KindQuotaExhausted  429  "You exceeded your current quota…"
//	overloaded        KindOverloaded      529  "Overloaded" (Anthropic)
//	unavailable       KindOverloaded      503  "The model is overloaded…"
//	server_error      KindServerError     500
//	bad_gateway       KindServerError     502
//	gateway_timeout   KindServerError     504
//	auth              KindAuth            401
//	forbidden         KindAuth            403
//	not_found         KindNotFound        404  names the model
//	invalid           KindInvalidRequest  400
//	context_overflow  KindContextOverflow 400  "prompt is too long: N tokens > M maximum"
//	content_filter    KindContentFiltered 400
//	disconnect        KindStreamInterrupted after streamed output, else
//	                  KindNetwork ("connection reset by peer"); no status
//	timeout (stall)   no error: the stream hangs until ctx is done, so the
//	                  runtime's first-token or idle timeout fires
//
// Every failure carries the provider name given to [New], a request id and,
// when retry_after is given, RetryAfter with HintAfter. A failure after
// streamed tokens keeps its class's status code.
//
// Directives apply in order, the script's first. The first failure whose
// conditions hold wins; times=K counts only the calls that reached it, per
// turn (Request.TurnID), provider model id and conversation (system prompt
// and messages), so "fail twice, then succeed" works across the runtime's
// retries of one request, and the same prompt fails the same way in every
// turn, while another conversation, or the next step of the turn, has its
// own count. A call continuing a cut reply counts as a call of the
// conversation it continues. Of the other actions the first of each kind counts, except tool,
// which adds a call each, and delay, of which the longest applies (a fail
// directive's delay only when it fails the call). A refusal wins over tool
// calls, tool calls over text. A malformed prompt directive fails the call with KindInvalidRequest
// (400) whose message quotes the directive; a malformed script directive
// makes [New] fail.
//
// A tool directive need not name one of Request.Tools: the simulator calls
// whatever it is told to, so the runtime's handling of unknown tools can be
// tested too. Tool call ids are call_1, call_2, …, counting the tool calls already in the
// conversation, so they are unique within it and stable across retries. Once
// the results of the last step's calls are in the conversation, the reply
// reports their content instead of calling again.
//
// # Examples
//
//	[sim fail=overloaded times=2] hello
//	    fails twice with 529, then answers
//	[sim fail=rate_limit retry_after=3s times=1]
//	[sim fail=disconnect after=5]
//	    five tokens, then KindStreamInterrupted
//	[sim fail=timeout times=1]
//	    the first attempt hangs until the runtime times it out
//	[sim fail=quota model=sim-primary]
//	    the primary always fails; a fallback model answers
//	[sim fail=context_overflow above=4000]
//	    fails until compaction shrinks the request to 4000 bytes or less
//	[sim tool=current_time args={"zone":"UTC"}] [sim tool=weather args={"city":"Oslo"}]
//	    two parallel tool calls, then an answer quoting their results
//	[sim think] [sim max_tokens=8] explain retries
//	[sim refuse="I won't do that."]
//	[sim reply="Hello there." delay=2s]
//
// In a configuration file:
//
//	providers:
//	  sim:
//	    type: simulator
//	    token_delay: 5ms
//	    script:
//	      - fail=overloaded times=1 model=sim-primary
//	      - "[sim think]"
package sim
