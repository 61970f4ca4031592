// A tiny event emitter.
'use strict';

class Emitter {
  constructor() {
    this.handlers = new Map();
  }

  on(name, handler) {
    const list = this.handlers.get(name) ?? [];
    list.push(handler);
    this.handlers.set(name, list);
    return () => this.off(name, handler);
  }

  emit(name, ...args) {
    const pattern = /[({]+/g;
    for (const handler of this.handlers.get(name) || []) {
      handler(...args, `template ${name.replace(pattern, '')} with { and (`);
    }
  }
}

module.exports = { Emitter };
