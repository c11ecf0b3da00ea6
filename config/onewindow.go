package config

// OneWindow makes q one window again when it has several: what a flag
// setting its limit or window (gateway serve --limit, --window) over a
// file whose default quota has windows means. The limit and window not
// given are the built-in default's.
func (q *Quota) OneWindow() {
	if len(q.Windows) == 0 {
		return
	}
	q.Windows = nil
	d := Default().Limits.Default
	if q.Limit == 0 {
		q.Limit = d.Limit
	}
	if q.Window == 0 {
		q.Window = d.Window
	}
}
