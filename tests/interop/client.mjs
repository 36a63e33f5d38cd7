#!/usr/bin/env node
// A Yjs client of crdtstore's hub, driven by JSON commands: the real `yjs` + `y-websocket`
// (3.x) packages, with `ws` as the WebSocket implementation and broadcast channels disabled.
//
//   node client.mjs --server ws://127.0.0.1:8765/<tenant> --run <run> --token <token>
//                   [--no-connect] [--no-register] [--stock-close] [COMMAND_JSON ...]
//
// The commands given on argv run first, in order; then one command per line is read from
// stdin until EOF or {"cmd": "exit"}; then the provider is destroyed (its socket closed
// cleanly) and the process exits, with status 1 if any command failed. Everything the driver
// says is one JSON object per line on stdout:
//
//   {"event": "status", "status": "connecting" | "connected" | "disconnected"}
//   {"event": "sync", "synced": true}
//   {"event": "connection-close", "code": 4401, "reason": "...", "local": false,
//    "http_status": 401 | null, "http_body": "TOKEN_EXPIRED: ..." | null}
//   {"event": "closed", "final": true, "code": ..., "reason": ..., "http_status": ...,
//    "by": "driver" | "y-websocket"}
//   {"event": "connection-error", "message": "..."}
//   {"event": "ready", "agent": "..."}                  (agent command: synced, about to write)
//   {"reply": "<cmd>", "seq": <n>, "ok": true, ...}     one per command, in order
//   {"reply": "<cmd>", "seq": <n>, "ok": false, "error": "...", "state": {...}}
//
// Final closes. A close code 4400-4499 means "do not retry" (sync/_errors.py CloseCode), and so
// does an HTTP 4xx refusal of the upgrade (the hub refuses a bad token with 401/403 before the
// WebSocket opens; `ws` then reports a close with code 1006, which y-websocket would retry for
// ever, as a browser would: a browser cannot even see the status). On either, the driver
// calls provider.disconnect() (y-websocket 3.0 retries after any close; 3.1 stops by itself
// on 4400-4499 only) and reports {"event": "closed", "by": "driver"}.
//
// --stock-close: none of that. The provider keeps y-websocket's own `shouldReconnect` (final on
// 4400-4499) and the driver never calls disconnect() on a close: {"event": "closed", "by":
// "y-websocket"} is reported when the provider itself emits its `closed` event (3.1+), which
// is what a plain y-websocket application sees. (An HTTP refusal then retries for ever.)
//
// Collections. crdtstore keeps a registry map `__crdtstore_collections` in the document:
// collection name -> "map" | "list" | "text"; the collection itself is the root type of that
// name (Y.Map, Y.Array, Y.Text). Every write below registers its collection in the same
// transaction (what a crdtstore record does), unless `"register": false` or --no-register.
//
// Commands ({"cmd": ..., ...}; "timeout" is in seconds):
//   connect / reconnect            provider.connect()
//   disconnect                     provider.disconnect() (later writes stay local: offline edits)
//   map.set {name, key, value}     map.delete {name, key}
//   map.update {name, values: {key: value, ...}}
//   array.push {name, values: [...]}   array.insert {name, index, values}
//   array.delete {name, index, count}
//   text.insert {name, index, text}    text.delete {name, index, count}
//   transact {ops: [write commands]}   several writes in one Yjs transaction
//   wait-for {timeout, <predicates>}   wait until all of these hold:
//       state: {collection: value}       each collection equals the value (dump form)
//       contains: {map: {key: value}}    these entries are present with these values
//       has_keys: {map: [key, ...]}      these keys are present
//       min_length: {collection: n}      a map, array or text has at least n entries/chars
//       synced: bool, connected: bool, final_close: bool
//   dump [{names: {root: kind}}]   the registered collections as JSON (plus named roots)
//   status                         connection state, client id, the last close seen
//   request {op, params, timeout}  a crdtstore extension request (type 100); reply has the
//                                  hub's response ({"result": ..} or {"error": ..})
//   flush {timeout}                request "flush": answered once the hub journaled every
//                                  update this connection sent before it
//   agent {map, agent, n, list, every, expect: [agent, ...], wait_go, timeout}
//       run as an agent: wait until synced; (with wait_go, read the line "go" from stdin);
//       write map[`${agent}:${i}`] = i for i < n, one transaction each (and append
//       `${agent}:${i}` to `list` every `every` writes); flush; wait until every expected
//       agent's n entries are present; reply with counts, timings and the final state.
//   exit                           stop reading commands

import * as Y from 'yjs'
import { WebsocketProvider } from 'y-websocket'
import WebSocket from 'ws'
import * as readline from 'node:readline'

const REGISTRY = '__crdtstore_collections'
const KINDS = { map: Y.Map, list: Y.Array, text: Y.Text }
const EXTENSION = 100

// -- output ---------------------------------------------------------------------------------

const say = (obj) => { process.stdout.write(JSON.stringify(obj) + '\n') }

// -- options --------------------------------------------------------------------------------

function parseArgs (argv) {
  const opts = { server: null, run: null, token: null, connect: true, register: true, stockClose: false, commands: [] }
  for (let i = 0; i < argv.length; i++) {
    const arg = argv[i]
    if (arg === '--server') opts.server = argv[++i]
    else if (arg === '--run') opts.run = argv[++i]
    else if (arg === '--token') opts.token = argv[++i]
    else if (arg === '--no-connect') opts.connect = false
    else if (arg === '--no-register') opts.register = false
    else if (arg === '--stock-close') opts.stockClose = true
    else if (arg.startsWith('--')) throw new Error(`unknown option ${arg}`)
    else opts.commands.push(JSON.parse(arg))
  }
  if (!opts.server || !opts.run) throw new Error('usage: client.mjs --server ws://host:port/<tenant> --run <run> [--token T] [COMMAND_JSON ...]')
  return opts
}

let opts
try {
  opts = parseArgs(process.argv.slice(2))
} catch (err) {
  process.stderr.write(`${err.message}\n`)
  process.exit(2)
}

// -- the WebSocket: `ws`, remembering an HTTP refusal of the upgrade --------------------------

// The hub refuses a bad token with an HTTP status and a body "CODE: reason". `ws` only says
// "Unexpected server response: 401" in an error event, so keep the status and body for the
// close event that follows.
class ReportingWebSocket extends WebSocket {
  constructor (url, protocols) {
    super(url, protocols)
    this.httpRefusal = null
    this.on('unexpected-response', (_req, res) => {
      let body = ''
      res.setEncoding('utf8')
      res.on('data', (chunk) => { if (body.length < 4096) body += chunk })
      const done = () => {
        if (this.httpRefusal !== null) return
        this.httpRefusal = { status: res.statusCode, body: body.trim() }
        this.terminate() // ends the handshake: an error event, then a close event (1006)
      }
      res.on('end', done)
      res.on('error', done)
      res.on('close', done)
    })
  }
}

const isFinal = (code, refusal) =>
  (code >= 4400 && code < 4500) || (refusal !== null && refusal.status >= 400 && refusal.status < 500)

// -- the document and the provider ------------------------------------------------------------

const doc = new Y.Doc()
const registry = doc.getMap(REGISTRY)
let lastClose = null
let finalClose = null
const waiters = new Set()
const pending = new Map() // request id -> resolve
let nextRequestId = 1

const providerOptions = {
  connect: false,
  params: opts.token ? { token: opts.token } : {},
  WebSocketPolyfill: ReportingWebSocket,
  disableBc: true
}
if (!opts.stockClose) {
  // y-websocket's default treats 4400-4499 as final; an HTTP 4xx refusal is final too
  providerOptions.shouldReconnect = (event) => !isFinal(event.code, event.target?.httpRefusal ?? null) // 3.1+
}
const provider = new WebsocketProvider(opts.server, opts.run, doc, providerOptions)

// crdtstore's extension messages: the hub only sends a response (sub-type 1) to a request.
provider.messageHandlers[EXTENSION] = (_encoder, decoder) => {
  const sub = decodeVarUint(decoder)
  const text = decodeVarString(decoder)
  if (sub !== 1) return
  const response = JSON.parse(text)
  const resolve = pending.get(response.id)
  if (resolve) {
    pending.delete(response.id)
    resolve(response)
  }
}

function notify () {
  for (const waiter of [...waiters]) waiter()
}

provider.on('status', ({ status }) => { say({ event: 'status', status }); notify() })
provider.on('sync', (synced) => { say({ event: 'sync', synced }); notify() })
provider.on('connection-error', (event) => {
  say({ event: 'connection-error', message: event?.message ?? String(event) })
})
provider.on('connection-close', (event) => {
  const refusal = event?.target?.httpRefusal ?? null
  lastClose = {
    code: event ? event.code : null,
    reason: event ? event.reason : null,
    local: event === null,
    http_status: refusal ? refusal.status : null,
    http_body: refusal ? refusal.body : null
  }
  say({ event: 'connection-close', ...lastClose })
  for (const [id, resolve] of pending) {
    pending.delete(id)
    resolve({ id, error: { code: 'CONNECTION_CLOSED', message: 'the connection closed before the response' } })
  }
  if (event !== null && !opts.stockClose && isFinal(lastClose.code, refusal)) {
    // Do not retry. y-websocket 3.1 stops by itself on 4400-4499 (shouldReconnect, above);
    // 3.0 retries after any close, so the app must call disconnect(). Deferred: the provider
    // is still inside its close handler; its retry timer fires 100 ms later at the earliest.
    const close = lastClose
    queueMicrotask(() => {
      provider.disconnect()
      finalClose = { final: true, ...close, by: 'driver' }
      say({ event: 'closed', ...finalClose })
      notify()
    })
  }
  notify()
})
provider.on('closed', (event) => { // y-websocket 3.1+: the server's close was final
  say({ event: 'provider-closed', code: event.code, reason: event.reason })
  if (opts.stockClose && finalClose === null) {
    finalClose = { final: true, ...lastClose, by: 'y-websocket' }
    say({ event: 'closed', ...finalClose })
    notify()
  }
})
doc.on('update', () => notify())

// lib0's decoding is a dependency of y-websocket; a few lines here avoid importing its paths.
function decodeVarUint (decoder) {
  let num = 0
  let mult = 1
  for (;;) {
    const byte = decoder.arr[decoder.pos++]
    num += (byte & 0x7f) * mult
    mult *= 128
    if (byte < 0x80) return num
    if (decoder.pos >= decoder.arr.length) throw new Error('truncated varUint')
  }
}

function decodeVarString (decoder) {
  const len = decodeVarUint(decoder)
  const bytes = decoder.arr.subarray(decoder.pos, decoder.pos + len)
  decoder.pos += len
  return new TextDecoder().decode(bytes)
}

function encodeVarUint (n, out) {
  while (n > 0x7f) {
    out.push(0x80 | (n & 0x7f))
    n = Math.floor(n / 128)
  }
  out.push(n)
}

// -- collections ------------------------------------------------------------------------------

function collection (name, kind, register) {
  const known = registry.get(name)
  if (known !== undefined && known !== kind) {
    throw new Error(`COLLECTION_KIND_MISMATCH: ${name} is a ${known}, not a ${kind}`)
  }
  if (register && known !== kind) registry.set(name, kind)
  if (kind === 'map') return doc.getMap(name)
  if (kind === 'list') return doc.getArray(name)
  return doc.getText(name)
}

function read (name, kind) {
  if (kind === 'map') return doc.getMap(name).toJSON()
  if (kind === 'list') return doc.getArray(name).toJSON()
  return doc.getText(name).toString()
}

function dump (extra = {}) {
  const out = {}
  const names = [...registry.keys()].filter((n) => KINDS[registry.get(n)] !== undefined).sort()
  for (const name of names) out[name] = read(name, registry.get(name))
  for (const [name, kind] of Object.entries(extra)) out[name] = read(name, kind)
  return out
}

function kindOf (name) {
  const kind = registry.get(name)
  return KINDS[kind] !== undefined ? kind : null
}

// One write; call inside doc.transact so that registration and the write are one update.
function write (op) {
  const register = op.register ?? opts.register
  switch (op.cmd) {
    case 'map.set': collection(op.name, 'map', register).set(op.key, op.value); break
    case 'map.delete': collection(op.name, 'map', register).delete(op.key); break
    case 'map.update': {
      const map = collection(op.name, 'map', register)
      for (const [k, v] of Object.entries(op.values)) map.set(k, v)
      break
    }
    case 'array.push': collection(op.name, 'list', register).push(op.values); break
    case 'array.insert': collection(op.name, 'list', register).insert(op.index, op.values); break
    case 'array.delete': collection(op.name, 'list', register).delete(op.index, op.count ?? 1); break
    case 'text.insert': collection(op.name, 'text', register).insert(op.index, op.text); break
    case 'text.delete': collection(op.name, 'text', register).delete(op.index, op.count); break
    default: throw new Error(`unknown write ${op.cmd}`)
  }
}

// -- waiting ----------------------------------------------------------------------------------

const deepEqual = (a, b) => JSON.stringify(canonical(a)) === JSON.stringify(canonical(b))

function canonical (v) {
  if (Array.isArray(v)) return v.map(canonical)
  if (v !== null && typeof v === 'object') {
    return Object.fromEntries(Object.keys(v).sort().map((k) => [k, canonical(v[k])]))
  }
  return v
}

function holds (p) {
  if (p.synced !== undefined && provider.synced !== p.synced) return false
  if (p.connected !== undefined && provider.wsconnected !== p.connected) return false
  if (p.final_close !== undefined && (finalClose !== null) !== p.final_close) return false
  for (const [name, want] of Object.entries(p.state ?? {})) {
    const kind = kindOf(name)
    if (kind === null || !deepEqual(read(name, kind), want)) return false
  }
  for (const [name, entries] of Object.entries(p.contains ?? {})) {
    if (kindOf(name) !== 'map') return false
    const map = doc.getMap(name)
    for (const [k, v] of Object.entries(entries)) {
      if (!map.has(k) || !deepEqual(map.get(k), v)) return false
    }
  }
  for (const [name, keys] of Object.entries(p.has_keys ?? {})) {
    if (kindOf(name) !== 'map') return false
    const map = doc.getMap(name)
    if (!keys.every((k) => map.has(k))) return false
  }
  for (const [name, n] of Object.entries(p.min_length ?? {})) {
    const kind = kindOf(name)
    if (kind === null) return false
    const value = read(name, kind)
    const len = kind === 'map' ? Object.keys(value).length : value.length
    if (len < n) return false
  }
  return true
}

// Resolve once check() is true (re-checked on every document update and provider event);
// reject after `timeout` seconds.
function waitUntil (check, timeout, what) {
  return new Promise((resolve, reject) => {
    const waiter = () => {
      let ok
      try {
        ok = check()
      } catch (err) {
        finish()
        reject(err)
        return
      }
      if (ok) {
        finish()
        resolve()
      }
    }
    const timer = setTimeout(() => {
      finish()
      reject(new Error(`TIMEOUT: ${what} did not hold within ${timeout} s`))
    }, timeout * 1000)
    const finish = () => {
      clearTimeout(timer)
      waiters.delete(waiter)
    }
    waiters.add(waiter)
    waiter()
  })
}

// -- extension requests -----------------------------------------------------------------------

async function request (op, params = {}, timeout = 10) {
  await waitUntil(() => provider.synced, timeout, 'synced (before a request)')
  const id = nextRequestId++
  const payload = new TextEncoder().encode(JSON.stringify({ id, op, params }))
  const frame = []
  encodeVarUint(EXTENSION, frame)
  encodeVarUint(0, frame)
  encodeVarUint(payload.length, frame)
  const bytes = new Uint8Array(frame.length + payload.length)
  bytes.set(frame)
  bytes.set(payload, frame.length)
  let timer
  const answer = new Promise((resolve, reject) => {
    pending.set(id, resolve)
    timer = setTimeout(() => {
      pending.delete(id)
      reject(new Error(`TIMEOUT: no response to ${op} within ${timeout} s`))
    }, timeout * 1000)
  })
  if (!provider.wsconnected || provider.ws === null) {
    pending.delete(id)
    clearTimeout(timer)
    throw new Error(`NOT_CONNECTED: cannot send ${op}`)
  }
  provider.ws.send(bytes)
  try {
    return await answer
  } finally {
    clearTimeout(timer)
  }
}

// -- stdin lines --------------------------------------------------------------------------------

const lines = []
let stdinEnded = false
let lineWaiter = null
const rl = readline.createInterface({ input: process.stdin, terminal: false })
rl.on('line', (line) => {
  if (!line.trim()) return
  lines.push(line)
  if (lineWaiter) lineWaiter()
})
rl.on('close', () => {
  stdinEnded = true
  if (lineWaiter) lineWaiter()
})

async function nextLine () {
  while (lines.length === 0 && !stdinEnded) {
    await new Promise((resolve) => { lineWaiter = resolve })
    lineWaiter = null
  }
  return lines.length ? lines.shift() : null
}

// -- the agent ----------------------------------------------------------------------------------

async function agent (c) {
  const { map: mapName = 'm', agent: me, n, list: listName = 'log', every = 0, expect = [me], timeout = 60 } = c
  const register = c.register ?? opts.register
  await waitUntil(() => provider.synced, timeout, 'synced')
  say({ event: 'ready', agent: me })
  if (c.wait_go) {
    const line = await nextLine()
    if (line === null || line.trim() !== 'go') throw new Error(`expected 'go' on stdin, got ${JSON.stringify(line)}`)
  }
  const started = performance.now()
  for (let i = 0; i < n; i++) {
    doc.transact(() => {
      collection(mapName, 'map', register).set(`${me}:${i}`, i)
      if (every > 0 && i % every === 0) collection(listName, 'list', register).push([`${me}:${i}`])
    })
  }
  const flushed = await request('flush', {}, timeout)
  if (flushed.error) throw new Error(`flush failed: ${JSON.stringify(flushed.error)}`)
  const wrote = performance.now() - started
  const wantLog = every > 0 ? expect.length * Math.ceil(n / every) : 0
  const complete = () => {
    if (kindOf(mapName) !== 'map') return false
    const map = doc.getMap(mapName)
    for (const a of expect) {
      for (let i = 0; i < n; i++) if (map.get(`${a}:${i}`) !== i) return false
    }
    return wantLog === 0 || (kindOf(listName) === 'list' && doc.getArray(listName).length >= wantLog)
  }
  await waitUntil(complete, timeout, `all ${expect.length * n} entries`)
  return {
    agent: me,
    entries: doc.getMap(mapName).size,
    log: wantLog ? doc.getArray(listName).length : 0,
    write_s: Math.round(wrote) / 1000,
    seen_all_s: Math.round(performance.now() - started) / 1000,
    state: dump()
  }
}

// -- commands -----------------------------------------------------------------------------------

async function run (c) {
  switch (c.cmd) {
    case 'connect':
    case 'reconnect':
      provider.connect()
      return {}
    case 'disconnect':
      provider.disconnect()
      return {}
    case 'transact':
      doc.transact(() => { for (const op of c.ops) write(op) })
      return {}
    case 'wait-for':
      await waitUntil(() => holds(c), c.timeout ?? 10, JSON.stringify(c))
      return {}
    case 'dump':
      return { state: dump(c.names ?? {}) }
    case 'status':
      return {
        connected: provider.wsconnected,
        synced: provider.synced,
        should_connect: provider.shouldConnect,
        client_id: doc.clientID,
        last_close: lastClose,
        final_close: finalClose
      }
    case 'request':
      return { response: await request(c.op, c.params ?? {}, c.timeout ?? 10) }
    case 'flush': {
      const response = await request('flush', {}, c.timeout ?? 10)
      if (response.error) throw new Error(`${response.error.code}: ${response.error.message}`)
      return {}
    }
    case 'agent':
      return await agent(c)
    default:
      if (typeof c.cmd === 'string' && /^(map|array|text)\./.test(c.cmd)) {
        doc.transact(() => write(c))
        return {}
      }
      throw new Error(`unknown command ${JSON.stringify(c.cmd)}`)
  }
}

let failed = false
let seq = 0

async function execute (c) {
  seq += 1
  try {
    const result = await run(c)
    say({ reply: c.cmd, seq, ok: true, ...result })
  } catch (err) {
    failed = true
    say({ reply: c?.cmd ?? null, seq, ok: false, error: err.message, state: dump() })
  }
}

async function shutdown () {
  const ws = provider.ws
  provider.destroy()
  // let the close handshake finish (what was sent before it reaches the hub first)
  if (ws && ws.readyState !== WebSocket.CLOSED) {
    await new Promise((resolve) => {
      const timer = setTimeout(resolve, 2000)
      ws.once('close', () => { clearTimeout(timer); resolve() })
    })
  }
  rl.close()
  process.exit(failed ? 1 : 0)
}

async function main () {
  if (opts.connect) provider.connect()
  for (const c of opts.commands) {
    if (c.cmd === 'exit') return shutdown()
    await execute(c)
  }
  for (;;) {
    const line = await nextLine()
    if (line === null) break
    let c
    try {
      c = JSON.parse(line)
    } catch (err) {
      failed = true
      say({ reply: null, seq: ++seq, ok: false, error: `not JSON: ${err.message}` })
      continue
    }
    if (c.cmd === 'exit') break
    await execute(c)
  }
  return shutdown()
}

main()
