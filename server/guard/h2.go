package guard

import (
	"encoding/binary"
	"errors"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// The HTTP/2 frames are watched, not parsed: h2Conn reads the 9-byte
// header of every frame passing through the connection, in both
// directions, and skips the payloads.

// Rapid-reset bound: a connection may have its client reset
// resetBurst streams at once, and resetRate a second after that.
// A client cancelling its own turns stays far below; one that opens
// and resets streams in a loop reaches it in milliseconds.
const (
	resetBurst = 200
	resetRate  = 10
)

// HTTP/2 frame types and flags this file looks at (RFC 9113).
const (
	frameHeaders      = 0x1
	frameRSTStream    = 0x3
	frameGoAway       = 0x7
	frameContinuation = 0x9
	flagEndHeaders    = 0x4

	codeFrameSize       = 0x6
	codeEnhanceYourCalm = 0xb

	// clientPreface is the length of "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".
	clientPreface = 24
)

// frameScanner follows the frames of one direction of an HTTP/2
// connection: it calls onFrame with each frame's header (and, for a
// RST_STREAM, its error code) and skips payloads.
type frameScanner struct {
	hdr  [9]byte
	have int // bytes of hdr read
	skip int // bytes of payload (or preface) left to pass over
	// rst collects a RST_STREAM's error code.
	rst     [4]byte
	rstHave int
	inRST   bool
	rstHdr  frameHeader
	onFrame func(h frameHeader, code uint32)
}

// frameHeader is the header of one frame.
type frameHeader struct {
	length int
	typ    byte
	flags  byte
	stream uint32
}

// feed passes p through the scanner.
func (s *frameScanner) feed(p []byte) {
	for len(p) > 0 {
		switch {
		case s.inRST:
			n := copy(s.rst[s.rstHave:], p)
			s.rstHave += n
			p = p[n:]
			if s.rstHave == 4 {
				s.inRST = false
				s.onFrame(s.rstHdr, binary.BigEndian.Uint32(s.rst[:]))
			}
		case s.skip > 0:
			n := min(s.skip, len(p))
			s.skip -= n
			p = p[n:]
		default:
			n := copy(s.hdr[s.have:], p)
			s.have += n
			p = p[n:]
			if s.have < 9 {
				continue
			}
			s.have = 0
			h := frameHeader{
				length: int(s.hdr[0])<<16 | int(s.hdr[1])<<8 | int(s.hdr[2]),
				typ:    s.hdr[3],
				flags:  s.hdr[4],
				stream: binary.BigEndian.Uint32(s.hdr[5:]) & 0x7fffffff,
			}
			if h.typ == frameRSTStream && h.length == 4 {
				s.inRST, s.rstHave, s.rstHdr = true, 0, h
				continue
			}
			s.skip = h.length
			s.onFrame(h, 0)
		}
	}
}

// atBoundary reports whether the bytes so far end with a whole frame.
func (s *frameScanner) atBoundary() bool { return s.have == 0 && s.skip == 0 && !s.inRST }

// errTooManyResets ends a connection whose client only resets streams.
var errTooManyResets = errors.New("server: the client reset too many streams")

// h2Conn is a connection gRPC serves, after its TLS handshake: it
// watches the frames both ways (see the top of this file).
type h2Conn struct {
	net.Conn
	g    *Guard
	pc   *peerConn
	host string

	// The read side, touched only by gRPC's reader goroutine.
	in         frameScanner
	seen       bool          // a frame was read
	inBlock    atomic.Bool   // a header block is open (no END_HEADERS yet)
	lastStream atomic.Uint32 // the GOAWAY's last stream
	streams    int
	resets     int
	tokens     float64
	refilled   time.Time
	tripped    atomic.Bool
	readFailed atomic.Bool

	// The write side, under wmu: gRPC's writer, and the GOAWAY.
	wmu          sync.Mutex
	out          frameScanner
	goAwayDue    atomic.Bool // a GOAWAY waits for the end of the frame being written
	headerLogged bool
	closed       bool
}

func newH2Conn(conn net.Conn, g *Guard, pc *peerConn) *h2Conn {
	c := &h2Conn{Conn: conn, g: g, pc: pc, tokens: resetBurst}
	c.host = hostOf(conn.RemoteAddr())
	c.in.skip = clientPreface
	c.in.onFrame = c.inFrame
	c.out.onFrame = c.outFrame
	return c
}

func (c *h2Conn) Read(p []byte) (int, error) {
	if c.tripped.Load() {
		return 0, errTooManyResets
	}
	n, err := c.Conn.Read(p)
	if n > 0 {
		c.in.feed(p[:n])
	}
	if err != nil {
		c.readFailed.Store(true)
	}
	return n, err
}

// inFrame sees each frame the client sends.
func (c *h2Conn) inFrame(h frameHeader, _ uint32) {
	if !c.seen {
		// The preface and a first frame: the handshake is done.
		c.seen = true
		if c.pc != nil {
			c.pc.handshaken()
		}
	}
	switch h.typ {
	case frameHeaders:
		if h.stream > c.lastStream.Load() {
			c.lastStream.Store(h.stream)
			c.streams++
		}
		c.inBlock.Store(h.flags&flagEndHeaders == 0)
	case frameContinuation:
		c.inBlock.Store(h.flags&flagEndHeaders == 0)
	case frameRSTStream:
		c.resets++
		now := time.Now()
		if !c.refilled.IsZero() {
			c.tokens = min(resetBurst, c.tokens+now.Sub(c.refilled).Seconds()*resetRate)
		}
		c.refilled = now
		if c.tokens >= 1 {
			c.tokens--
			return
		}
		if !c.tripped.Swap(true) {
			c.g.refused(reasonRapidReset)
			c.g.logSampled(slog.LevelWarn, c.host, "connection closed with GOAWAY: its client opens and resets streams faster than the server allows",
				"streams", c.streams, "resets", c.resets)
			c.goAwayDue.Store(true)
			// A write under way (gRPC's writer blocked on a client that
			// does not read) sends it when it ends.
			if c.wmu.TryLock() {
				c.flushGoAway()
				c.wmu.Unlock()
			}
		}
	}
}

// outFrame sees each frame the server writes.
func (c *h2Conn) outFrame(h frameHeader, code uint32) {
	// gRPC-Go answers a header list over MaxHeaderListSize with
	// RST_STREAM FRAME_SIZE_ERROR, and with nothing else.
	if h.typ == frameRSTStream && code == codeFrameSize {
		c.headerRefused()
	}
}

// headerRefused counts a stream or connection refused for its header's
// size, logging it once per connection. Call with wmu held.
func (c *h2Conn) headerRefused() {
	c.g.refused(reasonHeaderTooLarge)
	if !c.headerLogged {
		c.headerLogged = true
		c.g.logSampled(slog.LevelWarn, c.host, "request refused: its header is larger than server.max_header_bytes (logged once per connection)",
			"limit", c.g.headers)
	}
}

func (c *h2Conn) Write(p []byte) (int, error) {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	n, err := c.Conn.Write(p)
	c.out.feed(p[:n])
	c.flushGoAway()
	return n, err
}

// flushGoAway writes the GOAWAY that waits, if the bytes written so far
// end with a whole frame, and closes the connection. Call with wmu held.
func (c *h2Conn) flushGoAway() {
	if !c.goAwayDue.Load() || !c.out.atBoundary() || c.closed {
		return
	}
	c.goAwayDue.Store(false)
	const debug = "too_many_resets"
	f := make([]byte, 9+8+len(debug))
	n := 8 + len(debug)
	f[0], f[1], f[2], f[3] = byte(n>>16), byte(n>>8), byte(n), frameGoAway
	binary.BigEndian.PutUint32(f[9:], c.lastStream.Load())
	binary.BigEndian.PutUint32(f[13:], codeEnhanceYourCalm)
	copy(f[17:], debug)
	_ = c.Conn.SetWriteDeadline(time.Now().Add(time.Second))
	_, _ = c.Conn.Write(f)
	c.closed = true
	_ = c.Conn.Close()
}

func (c *h2Conn) Close() error {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	// gRPC closes a connection whose header block does not decode: one
	// header longer than max_header_bytes ends there, mid-block.
	if c.inBlock.Swap(false) && !c.readFailed.Load() && !c.tripped.Load() {
		c.headerRefused()
	}
	c.flushGoAway()
	if c.closed {
		return nil
	}
	c.closed = true
	return c.Conn.Close()
}
