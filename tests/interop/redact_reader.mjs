#!/usr/bin/env node
// A plain Yjs client (`yjs` + `y-websocket`) holding a run's record while another client
// redacts values through the hub (tests/network/test_redact_ws.py):
//
//   node redact_reader.mjs SERVER RUN TOKEN SECRET [SECRET ...]
//
// Prints {"event": "ready"} once its document holds every SECRET (in the bytes of
// Y.encodeStateAsUpdate), then, without reconnecting, {"event": "dropped", "state": ...} once
// none of them is left in those bytes (Yjs garbage-collects deleted content), or
// {"event": "stuck", "left": [...]} after 60 s.

import * as Y from 'yjs'
import { WebsocketProvider } from 'y-websocket'
import WebSocket from 'ws'

const [server, run, token, ...secrets] = process.argv.slice(2)
const say = (obj) => { process.stdout.write(JSON.stringify(obj) + '\n') }
const doc = new Y.Doc()
const provider = new WebsocketProvider(server, run, doc, {
  params: { token },
  WebSocketPolyfill: WebSocket,
  disableBc: true
})
const held = () => {
  const bytes = Buffer.from(Y.encodeStateAsUpdate(doc))
  return secrets.filter((s) => bytes.includes(Buffer.from(s, 'utf8')))
}
const dump = () => ({
  m: doc.getMap('m').toJSON(),
  l: doc.getArray('l').toJSON(),
  t: doc.getText('t').toString()
})
let phase = 'loading'
let connects = 0
provider.on('status', ({ status }) => { if (status === 'connected') connects += 1 })
const check = () => {
  if (phase === 'loading' && held().length === secrets.length) {
    phase = 'holding'
    say({ event: 'ready' })
  } else if (phase === 'holding' && held().length === 0) {
    phase = 'done'
    say({ event: 'dropped', state: dump(), connects })
    provider.destroy()
    process.exit(0)
  }
}
doc.on('afterTransaction', check)
provider.on('sync', check)
setTimeout(() => {
  say({ event: 'stuck', phase, left: held(), state: dump() })
  provider.destroy()
  process.exit(1)
}, 60000)
