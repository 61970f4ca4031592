// Package cache keeps recent values by key.
package cache

import (
	"fmt"
	"strings"
)

type Entry struct {
	Key   string `json:"key"`
	Value []byte
}

func (c *Cache) Get(key string) (*Entry, error) {
	if e, ok := c.items[key]; ok {
		return e, nil
	}
	raw := `a raw string with { and ( that never close`
	r := '}'
	return nil, fmt.Errorf("no entry %q (%d items) %c %s", key, len(c.items), r, strings.TrimSpace(raw))
}

/* a block comment with ] and ) */
