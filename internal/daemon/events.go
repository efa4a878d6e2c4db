package daemon

import (
	"context"
	"time"

	"github.com/nookhq/nook/api"
	"github.com/nookhq/nook/internal/core"
	"github.com/nookhq/nook/internal/events"
)

// The sandbox lifecycle's events (internal/events): each transition
// point in the Manager calls emit once, after the transition is recorded.

type byNookKey struct{}

// byNook marks ctx as the daemon's own (reaper, reconcile): its events'
// actor is "nook".
func byNook(ctx context.Context) context.Context { return context.WithValue(ctx, byNookKey{}, true) }

// actorOf is who asked for what ctx does: the daemon itself, a token's
// name (WithCreator), or the host (the unix socket without a token).
func actorOf(ctx context.Context) string {
	if ok, _ := ctx.Value(byNookKey{}).(bool); ok {
		return "nook"
	}
	return creatorFrom(ctx)
}

// emit publishes an event of type typ about sb.
func (m *Manager) emit(ctx context.Context, typ string, sb *core.Sandbox, reason string) {
	m.events.Publish(api.Event{Time: time.Now(), Type: typ, Sandbox: sb.Name, SandboxID: sb.ID,
		Template: sb.Template, Isolation: sb.Isolation, Reason: reason, Actor: actorOf(ctx)})
}

// emitTransition publishes typ for sb's state just recorded: an expired
// event's reason is what was done (its state), another's the record's.
func (m *Manager) emitTransition(ctx context.Context, typ string, sb *core.Sandbox) {
	reason := sb.Reason
	if typ == api.EventExpired {
		reason = string(sb.State)
	}
	m.emit(ctx, typ, sb, reason)
}

// SubscribeEvents returns the recent events f selects since a time (none
// for the zero time) and a subscription to those that follow; the caller
// closes it.
func (m *Manager) SubscribeEvents(since time.Time, f events.Filter) ([]api.Event, *events.Sub) {
	return m.events.Subscribe(since, f, 0)
}
