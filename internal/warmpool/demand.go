package warmpool

import "time"

// Demand is measured over these two spans; see the package doc.
const (
	// BurstWindow is the span a burst of takes is counted over.
	BurstWindow = 2 * time.Second
	// QuietPeriod is how long a burst keeps a key's target raised.
	QuietPeriod = time.Minute
)

// demand is a key's recent takes: the burst in the last BurstWindow, and
// the peak bursts of the last QuietPeriod. Both lists hold at most limit
// entries (a pool never keeps more than its cap warm, so a burst beyond
// it need not be counted further), whatever the create rate.
type demand struct {
	takes []time.Time // within BurstWindow of the last take, oldest first, at most limit
	peaks []peak      // a sliding maximum: at ascending, n strictly descending
}

// peak is the burst counted at a take.
type peak struct {
	at time.Time
	n  int
}

// record counts a take at now, up to limit takes per BurstWindow.
func (d *demand) record(now time.Time, limit int) {
	i := 0
	for i < len(d.takes) && !d.takes[i].After(now.Add(-BurstWindow)) {
		i++
	}
	d.takes = append(d.takes[i:], now)
	if len(d.takes) > limit {
		d.takes = d.takes[len(d.takes)-limit:]
	}
	n := len(d.takes)
	d.prune(now)
	j := len(d.peaks)
	for j > 0 && d.peaks[j-1].n <= n {
		j--
	}
	d.peaks = append(d.peaks[:j], peak{at: now, n: n})
}

// prune forgets the bursts older than QuietPeriod.
func (d *demand) prune(now time.Time) {
	i := 0
	for i < len(d.peaks) && !d.peaks[i].at.After(now.Add(-QuietPeriod)) {
		i++
	}
	d.peaks = d.peaks[i:]
}

// peak returns the largest burst of the last QuietPeriod (0: none), and
// when it expires.
func (d *demand) peak(now time.Time) (int, time.Time) {
	d.prune(now)
	if len(d.peaks) == 0 {
		return 0, time.Time{}
	}
	return d.peaks[0].n, d.peaks[0].at.Add(QuietPeriod)
}
