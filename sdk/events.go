package sdk

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/url"

	"github.com/nookhq/nook/api"
)

// EventsOptions selects the events a stream carries; the zero value is
// every event from now on.
type EventsOptions struct {
	Sandbox string   // one sandbox's, by name
	Types   []string // of these types (api.EventTypes)
	// Since replays the daemon's recent events first: a duration back
	// ("10m") or a time (RFC 3339).
	Since string
}

// EventStream streams lifecycle events; it is subscribed when Events returns.
type EventStream struct {
	body io.ReadCloser
	sc   *bufio.Scanner
	ctx  context.Context
}

// Events streams the daemon's sandbox lifecycle events (created, paused,
// paused-by-idle, expired, failed, forked, rolled-back, ...). A sandbox
// token sees its own sandbox's only. Cancel ctx or Close to stop; a
// stream whose reader fell behind ends with an api.EventLagged event.
func (c *Client) Events(ctx context.Context, o EventsOptions) (*EventStream, error) {
	q := url.Values{}
	if o.Sandbox != "" {
		q.Set("sandbox", o.Sandbox)
	}
	if o.Since != "" {
		q.Set("since", o.Since)
	}
	for _, t := range o.Types {
		q.Add("type", t)
	}
	p := "/v1/events"
	if len(q) > 0 {
		p += "?" + q.Encode()
	}
	resp, err := c.do(ctx, "GET", p, nil)
	if err != nil {
		return nil, err
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	return &EventStream{body: resp.Body, sc: sc, ctx: ctx}, nil
}

// Next waits for the next event.
func (s *EventStream) Next() (*api.Event, error) {
	if !s.sc.Scan() {
		if s.ctx.Err() != nil {
			return nil, s.ctx.Err()
		}
		err := s.sc.Err()
		if err == nil {
			err = io.ErrUnexpectedEOF
		}
		return nil, fmt.Errorf("the event stream ended: %w", err)
	}
	var ev api.Event
	if err := json.Unmarshal(s.sc.Bytes(), &ev); err != nil {
		return nil, fmt.Errorf("bad event: %w", err)
	}
	return &ev, nil
}

// Close ends the stream.
func (s *EventStream) Close() error { return s.body.Close() }
