package cluster

import (
	"context"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/devicegate/devicegate/cluster/redistest"
)

// evalEach's EVALSHA finds no script on a server that never loaded it
// (or flushed it): the calls are run again with EVAL, each with its own
// keys and arguments, and a call that fails for another reason keeps
// its error.
func TestEvalEachLoadsTheScriptAgain(t *testing.T) {
	c := redistest.Start(t).Client()
	ctx := context.Background()
	s := redis.NewScript(`if ARGV[1] == "fail" then return redis.error_reply("ERR asked to fail") end
return {KEYS[1], ARGV[1]}`)
	if err := c.ScriptFlush(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	keys := []string{"k0", "k1", "k2"}
	args := []string{"a", "fail", "c"}
	cmds := evalEach(ctx, c, s, len(keys), func(i int) []string { return keys[i : i+1] }, func(i int) []any { return []any{args[i]} })
	for i, cmd := range cmds {
		v, err := cmd.StringSlice()
		if i == 1 {
			if err == nil || isNoScript(err) {
				t.Errorf("call 1: %v, %v; want the script's own error", v, err)
			}
			continue
		}
		if err != nil || len(v) != 2 || v[0] != keys[i] || v[1] != args[i] {
			t.Errorf("call %d: %v, %v; want [%s %s]", i, v, err, keys[i], args[i])
		}
	}
}
