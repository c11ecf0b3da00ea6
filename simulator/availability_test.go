package simulator

import (
	"testing"
	"time"

	"github.com/devicegate/devicegate/devicelimit"
)

// After a restart: a device admitted at its first publish, one refused
// three times
// with room in its window (quota the restart took) and admitted after
// 3 s, one refused with its window full (not a loss), and one that sent
// nothing after the restart (not counted).
func TestAvailabilityAfterRestart(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	at := func(d time.Duration) time.Time { return t0.Add(d) }
	q := devicelimit.Quota{Limit: 2, Window: 10 * time.Second}
	ev := RestartEvent{Mode: "kill", At: at(5 * time.Second), Took: 500 * time.Millisecond}
	back := 5500 * time.Millisecond
	logs := []DeviceLog{
		{Device: "a", Quota: q, Sent: []Sent{{Seq: 1, At: at(back + 100*time.Millisecond), Ack: AckSuccess}}},
		{Device: "b", Quota: q, Sent: []Sent{
			{Seq: 1, At: at(back), Ack: AckRefused},
			{Seq: 2, At: at(back + time.Second), Ack: AckRefused},
			{Seq: 3, At: at(back + 2*time.Second), Ack: AckRefused},
			{Seq: 4, At: at(back + 3*time.Second), Ack: AckSuccess},
		}},
		{Device: "c", Quota: q, Sent: []Sent{
			{Seq: 1, At: at(time.Second), Ack: AckSuccess},
			{Seq: 2, At: at(2 * time.Second), Ack: AckSuccess},
			{Seq: 3, At: at(back), Ack: AckRefused},
		}, Arrivals: []Arrival{{Seq: 1, At: at(time.Second)}, {Seq: 2, At: at(2 * time.Second)}}},
		{Device: "d", Quota: q, Sent: []Sent{{Seq: 1, At: at(time.Second), Ack: AckSuccess}}},
	}
	got := availability(logs, []RestartEvent{ev})
	if len(got) != 1 {
		t.Fatalf("%d restarts, want 1", len(got))
	}
	a := got[0]
	if a.Devices != 3 || a.Within != 1 || a.Never != 1 || a.Lost != 3 || a.MaxLost != 3 || a.LostDevices != 1 || a.Max != 3*time.Second {
		t.Fatalf("got %+v", a)
	}
	want := []DeviceRestart{{"a", 0, 0}, {"b", 3 * time.Second, 3}, {"c", -1, 0}}
	for i, d := range a.PerDevice {
		if d != want[i] {
			t.Errorf("device %d: %+v, want %+v", i, d, want[i])
		}
	}
}
