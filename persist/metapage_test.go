package persist

import (
	"fmt"
	"math/rand/v2"
	"testing"
)

// A damaged meta page (page 0 or 1 of the bbolt file) is refused like
// any other damage: ErrCorrupt naming the file, the file left as it
// was. Whole pages of random bytes, and single fields broken: the magic
// number, the checksum, the root bucket's page, the freelist's page, the
// page count.
func TestOpenDamagedMetaPage(t *testing.T) {
	path := writeStore(t, 5000)
	rng := rand.New(rand.NewPCG(28, 3))
	// Offsets in a meta page: the 16-byte page header, then magic (4),
	// version (4), page size (4), flags (4), root bucket (16), freelist
	// (8), page count (8), txid (8), checksum (8).
	fields := map[string][2]int{
		"magic": {16, 4}, "root": {32, 8}, "freelist": {48, 8},
		"pgid": {56, 8}, "checksum": {72, 8},
	}
	for _, page := range []int{0, 1} {
		for _, what := range []string{"random", "magic", "root", "freelist", "pgid", "checksum", "both"} {
			t.Run(fmt.Sprintf("page%d/%s", page, what), func(t *testing.T) {
				b := fileBytes(t, path)
				damage := func(page int) {
					off := page * 4096
					if f, ok := fields[what]; ok {
						for i := off + f[0]; i < off+f[0]+f[1]; i++ {
							b[i] ^= byte(1 + rng.IntN(255))
						}
						return
					}
					for i := off; i < off+4096; i++ {
						b[i] = byte(rng.Uint32())
					}
				}
				damage(page)
				if what == "both" {
					damage(1 - page)
				}
				p := dataFile(t, b)
				openBroken(t, p, ErrCorrupt)
			})
		}
	}
}
