// The sections of the run page, each built from plain data (a Y.Doc, the journal's
// provenance, the lease status): collections, leases, the kernel's steps, an entry, presence.
import { h, valueCell, agentChip, agentClass, time, seconds, shown, json } from './dom.js'

const REGISTRY = '__crdtstore_collections'
const SEP = '\x1f'
export const FLOW = 'flow'

/** name -> kind ("map" | "list" | "text") of the collections the record declares. */
export const collectionsOf = (doc) => {
  const out = new Map()
  for (const [name, kind] of doc.getMap(REGISTRY).entries()) {
    if (kind === 'map' || kind === 'list' || kind === 'text') out.set(name, kind)
  }
  return new Map([...out.entries()].sort((a, b) => (a[0] < b[0] ? -1 : a[0] > b[0] ? 1 : 0)))
}

const provCells = (p, value) => {
  if (p === undefined) {
    return [h('td', { class: 'who muted', title: 'written before the first journal entry the viewer holds (a snapshot)' }, 'snapshot'),
      h('td'), h('td'), h('td', { class: 'seq' })]
  }
  // a value the journal does not have yet (applied by the hub, not yet journaled)
  const pending = p.op === 'set' && value !== undefined && shown(p.value) !== shown(value)
  if (pending) {
    return [h('td', { class: 'who pending' }, 'not yet journaled'), h('td'), h('td'), h('td', { class: 'seq' })]
  }
  return [
    h('td', { class: 'who' }, agentChip(p.row.agent)),
    h('td', { class: 'source' }, p.row.source),
    h('td', { class: 'time' }, time(p.row.wallTime)),
    h('td', { class: 'seq' }, h('a', { class: 'jump', href: '#', 'data-seq': p.row.seq }, `#${p.row.seq}`))
  ]
}

const MAX_ROWS_SHOWN = 1000 // per collection (the page stays quick on big records)

const capped = (rows, total) => total > rows.length
  ? [...rows, h('tr', { class: 'more' }, h('td', { colspan: 6, class: 'muted' }, `… ${total - rows.length} more not shown`))]
  : rows

const isSibling = (value) =>
  value !== null && typeof value === 'object' && !Array.isArray(value) && 'v' in value

const mapTable = (name, ymap, prov, keepAll) => {
  const keys = prov.get(name) || new Map()
  const rows = []
  let total = 0
  const entries = [...ymap.entries()].sort((a, b) => (a[0] < b[0] ? -1 : a[0] > b[0] ? 1 : 0))
  if (keepAll) {
    const groups = new Map()
    for (const [pkey, entry] of entries) {
      const cut = pkey.lastIndexOf(SEP)
      if (cut < 0 || !isSibling(entry)) continue
      const key = pkey.slice(0, cut)
      if (!groups.has(key)) groups.set(key, [])
      groups.get(key).push({ pkey, entry })
    }
    total = groups.size
    for (const [key, sibs] of [...groups.entries()].slice(0, MAX_ROWS_SHOWN)) {
      sibs.sort((a, b) => (a.entry.t || 0) - (b.entry.t || 0) || (a.pkey < b.pkey ? -1 : 1))
      if (sibs.length === 1) {
        const { pkey, entry } = sibs[0]
        rows.push(h('tr', { 'data-collection': name, 'data-key': key },
          h('td', { class: 'key' }, key), valueCell(entry.v), ...provCells(keys.get(pkey), entry)))
      } else {
        const list = h('td', { class: 'value conflict', colspan: 5 },
          h('div', { class: 'conflict-head' }, `conflict: ${sibs.length} concurrent values`),
          sibs.map(({ pkey, entry }) => {
            const p = keys.get(pkey)
            return h('div', { class: 'sibling', 'data-agent': String(entry.a) },
              agentChip(String(entry.a)), ' ', h('span', { class: 'str' }, shown(entry.v)),
              h('span', { class: 'muted' }, ` ${entry.s || ''} ${time(entry.t)}${p ? ` #${p.row.seq}` : ''}`))
          }))
        rows.push(h('tr', { 'data-collection': name, 'data-key': key, class: 'has-conflict' },
          h('td', { class: 'key' }, key), list))
      }
    }
  } else {
    total = entries.length
    for (const [key, value] of entries.slice(0, MAX_ROWS_SHOWN)) {
      rows.push(h('tr', { 'data-collection': name, 'data-key': key },
        h('td', { class: 'key' }, key), valueCell(value), ...provCells(keys.get(key), value)))
    }
  }
  if (rows.length === 0) return h('p', { class: 'muted' }, 'empty')
  return h('table', { class: 'grid' },
    h('thead', {}, h('tr', {}, ['key', 'value', 'agent', 'source', 'time', 'entry'].map((c) => h('th', {}, c)))),
    h('tbody', {}, capped(rows, total)))
}

/** The live items of a Yjs list or text, each with the Yjs client that made it. */
const items = (type) => {
  const out = []
  for (let item = type._start; item !== null; item = item.right) {
    if (!item.deleted && item.countable) out.push(item)
  }
  return out
}

const listTable = (name, yarray, clients) => {
  const all = [] // [value, client] of every item
  for (const item of items(yarray)) {
    for (const value of item.content.getContent()) all.push([value, item.id.client])
  }
  if (all.length === 0) return h('p', { class: 'muted' }, 'empty')
  const start = Math.max(0, all.length - MAX_ROWS_SHOWN) // (the newest items of a long log)
  const rows = all.slice(start).map(([value, client], i) => {
    const agent = clients.get(client)
    return h('tr', { 'data-collection': name, 'data-index': start + i },
      h('td', { class: 'key' }, String(start + i)), valueCell(value),
      h('td', { class: 'who' }, agent ? agentChip(agent) : '?'))
  })
  if (start > 0) rows.unshift(h('tr', { class: 'more' }, h('td', { colspan: 3, class: 'muted' }, `… ${start} older items not shown`)))
  return h('table', { class: 'grid' },
    h('thead', {}, h('tr', {}, ['#', 'value', 'agent'].map((c) => h('th', {}, c)))),
    h('tbody', {}, rows))
}

const textBlock = (name, ytext, clients) => {
  const spans = []
  const authors = new Set()
  let last = null
  for (const item of items(ytext)) {
    const str = typeof item.content.str === 'string' ? item.content.str : ''
    if (!str) continue
    const agent = clients.get(item.id.client) || '?'
    authors.add(agent)
    if (last !== null && last.agent === agent) {
      last.text += str
    } else {
      last = { agent, text: str }
      spans.push(last)
    }
  }
  if (spans.length === 0) return h('p', { class: 'muted' }, 'empty')
  return h('div', {},
    h('div', { class: 'legend' }, 'authors: ', [...authors].map((a) => agentChip(a))),
    h('pre', { class: 'text', 'data-collection': name },
      spans.map((s) => h('span', { class: `span tint ${agentClass(s.agent)}`, title: s.agent, 'data-agent': s.agent }, s.text))))
}

/** Every collection of `doc` (but the kernel's `flow`), with provenance from the journal. */
export const collections = (doc, prov, clients, config) => {
  const declared = (config && config.collections) || {}
  const out = []
  for (const [name, kind] of collectionsOf(doc)) {
    if (name === FLOW) continue
    const decl = declared[name] || {}
    const keepAll = kind === 'map' && decl.conflict === 'keep_all'
    let body
    try {
      if (kind === 'map') body = mapTable(name, doc.getMap(name), prov, keepAll)
      else if (kind === 'list') body = listTable(name, doc.getArray(name), clients)
      else body = textBlock(name, doc.getText(name), clients)
    } catch (err) { // (a root another client made of another type: show the rest)
      body = h('p', { class: 'muted' }, `cannot show this collection: ${err.message || err}`)
    }
    const tags = [kind, decl.policy && decl.policy !== 'open' ? decl.policy : null, keepAll ? 'keep_all' : null]
    out.push(h('section', { class: 'collection', 'data-name': name },
      h('h3', {}, name, ' ', tags.filter(Boolean).map((t) => h('span', { class: 'tag' }, t))),
      body))
  }
  if (out.length === 0) out.push(h('p', { class: 'muted' }, 'no collections yet'))
  return out
}

// -- leases ----------------------------------------------------------------------------------

/** Per resource: its holder (with fencing token and expiry) and its FIFO queue of waiters. */
export const leases = (status, fetchedAt, now) => {
  if (!status) return [h('p', { class: 'muted' }, 'loading…')]
  const drift = (now - fetchedAt) / 1000
  const byResource = new Map()
  const slot = (r) => {
    if (!byResource.has(r)) byResource.set(r, { holder: null, waiters: [] })
    return byResource.get(r)
  }
  for (const l of status.holders || []) for (const r of l.resources) slot(r).holder = l
  for (const l of [...(status.waiters || [])].sort((a, b) => a.rank - b.rank)) {
    for (const r of l.resources) slot(r).waiters.push(l)
  }
  if (byResource.size === 0) return [h('p', { class: 'muted' }, 'no leases held or waited for')]
  const rows = [...byResource.entries()].sort((a, b) => (a[0] < b[0] ? -1 : 1)).map(([resource, s]) =>
    h('tr', { 'data-resource': resource },
      h('td', { class: 'key' }, resource),
      h('td', { class: 'holder' }, s.holder
        ? [agentChip(s.holder.owner), ' ', h('span', { class: 'token', title: 'fencing token' }, `token ${s.holder.token}`),
            h('span', { class: 'muted' }, ` expires in ${seconds(s.holder.expires_in - drift)}`),
            s.holder.key ? h('span', { class: 'muted' }, ` step ${s.holder.key[0]}#${s.holder.key[1]}`) : null]
        : h('span', { class: 'muted' }, 'free')),
      h('td', { class: 'queue' }, s.waiters.length === 0
        ? h('span', { class: 'muted' }, '—')
        : h('ol', { class: 'waiters' }, s.waiters.map((w) =>
          h('li', { class: 'waiter', 'data-owner': w.owner }, agentChip(w.owner),
            h('span', { class: 'muted' }, ` waiting ${seconds(w.age + drift)}`)))))))
  return [h('table', { class: 'grid' },
    h('thead', {}, h('tr', {}, ['resource', 'holder', 'queue (first in line first)'].map((c) => h('th', {}, c)))),
    h('tbody', {}, rows))]
}

// -- the kernel's steps -----------------------------------------------------------------------

const STATE_ORDER = ['running', 'waiting_on_lock', 'pending', 'done', 'failed', 'cancelled', 'skipped']

/** The `flow` map's step entries (and its `@run` entry), or null when the run has none. */
export const steps = (doc, collectionKinds) => {
  if (collectionKinds.get(FLOW) !== 'map') return null
  const flow = doc.getMap(FLOW)
  const run = flow.get('@run')
  const list = []
  for (const [path, entry] of flow.entries()) {
    if (path.startsWith('@') || entry === null || typeof entry !== 'object') continue
    list.push(entry)
  }
  if (list.length === 0 && !run) return null
  const children = new Map()
  for (const s of list) {
    const parent = String(s.parent || '')
    if (!children.has(parent)) children.set(parent, [])
    children.get(parent).push(s)
  }
  const ordered = []
  const seen = new Set()
  const walk = (parent) => {
    const kids = (children.get(parent) || []).sort((a, b) => (a.index || 0) - (b.index || 0) || (String(a.path) < String(b.path) ? -1 : 1))
    for (const s of kids) {
      if (seen.has(s.path)) continue
      seen.add(s.path)
      ordered.push(s)
      walk(String(s.path))
    }
  }
  walk('')
  for (const s of list) if (!seen.has(s.path)) ordered.push(s) // (an orphan: its parent is not there)
  list.splice(0, list.length, ...ordered)
  const head = run && typeof run === 'object'
    ? h('p', { class: 'run-line' }, 'workflow ', h('b', {}, String(run.name)), ' ',
        h('span', { class: `state s-${run.state}` }, String(run.state)),
        h('span', { class: 'muted' }, ` kernel ${run.kernel || '?'} · started ${time(run.started)}${run.ended ? ' · ended ' + time(run.ended) : ''}`))
    : null
  const counts = new Map()
  for (const s of list) counts.set(s.state, (counts.get(s.state) || 0) + 1)
  const summary = h('p', { class: 'muted' }, [...counts.entries()]
    .sort((a, b) => STATE_ORDER.indexOf(a[0]) - STATE_ORDER.indexOf(b[0]))
    .map(([state, n]) => h('span', { class: `state s-${state}` }, `${n} ${state}`)))
  const rows = list.map((s) => {
    const depth = String(s.path).split('/').length - 1
    const dur = typeof s.started === 'number'
      ? seconds((typeof s.ended === 'number' ? s.ended : Date.now() / 1000) - s.started)
      : ''
    const detail = []
    if (s.waiting && Array.isArray(s.waiting.ahead) && s.waiting.ahead.length) {
      detail.push(h('span', { class: 'muted' }, 'behind '), s.waiting.ahead.map((w) => agentChip(String(w.owner))))
    }
    if (s.error && typeof s.error === 'object') {
      detail.push(h('span', { class: 'error-code' }, String(s.error.code || 'error')), ' ', String(s.error.message || ''))
    }
    return h('tr', { 'data-step': s.path },
      h('td', { class: `key depth${Math.min(depth, 6)}` }, String(s.path)),
      h('td', {}, String(s.kind)),
      h('td', {}, h('span', { class: `state s-${s.state}` }, String(s.state))),
      h('td', {}, String(s.attempt ?? '')),
      h('td', {}, s.agent ? agentChip(String(s.agent)) : ''),
      h('td', {}, (s.files || []).join(', ')),
      h('td', {}, s.lease ? `token ${s.lease.token}` : ''),
      h('td', {}, dur),
      h('td', {}, detail))
  })
  return [head, summary, h('table', { class: 'grid' },
    h('thead', {}, h('tr', {}, ['step', 'kind', 'state', 'attempt', 'agent', 'files', 'lease', 'time', ''].map((c) => h('th', {}, c)))),
    h('tbody', {}, rows))]
}

// -- the journal entry under the cursor -------------------------------------------------------

const MAX_OP_TEXT = 240

const quoted = (value) => {
  const out = json(value)
  return out.length > MAX_OP_TEXT ? out.slice(0, MAX_OP_TEXT) + '…' : out
}

const opText = (op) => {
  if (!Array.isArray(op)) return quoted(op)
  const [kind, coll, what, ...rest] = op
  const target = kind === 'map' ? `${coll}[${quoted(rest[0])}]` : `${coll} @${quoted(rest[0])}`
  return `${what} ${target}${rest.length > 1 ? ' ' + quoted(rest[1]) : ''}`
}

export const entry = (row) => {
  if (!row) return [h('p', { class: 'muted' }, 'no entry at this position')]
  return [
    h('p', { class: 'entry-head', 'data-seq': row.seq },
      h('b', {}, `#${row.seq}`), ' ', agentChip(row.agent), ' ',
      h('span', { class: 'tag' }, row.source), ' ', h('span', { class: 'muted' }, time(row.wallTime)),
      row.call ? h('span', { class: 'muted' }, ` call ${row.call}`) : null,
      row.origin ? h('span', { class: 'muted' }, ` run ${row.origin}`) : null),
    row.effect.length
      ? h('ul', { class: 'effect' }, row.effect.slice(0, 50).map((op) => h('li', {}, opText(op))),
          row.effect.length > 50 ? h('li', { class: 'muted' }, `… ${row.effect.length - 50} more`) : null)
      : h('p', { class: 'muted' }, 'no effect recorded (a plain Yjs update)')
  ]
}

// -- who is connected -------------------------------------------------------------------------

export const presence = (connections, awareness, ownClient) => {
  const out = []
  if (Array.isArray(connections)) {
    out.push(h('ul', { class: 'people' }, connections.map((c) =>
      h('li', { 'data-agent': String(c.agent) }, agentChip(String(c.agent)), ' ',
        h('span', { class: 'tag' }, c.mode === 'ro' ? 'read-only' : 'read-write'), ' ',
        h('span', { class: 'muted' }, c.protocol === 'crdtstore' ? 'crdtstore client' : 'Yjs client')))))
  }
  const states = []
  for (const [client, state] of awareness) {
    if (client === ownClient || !state || typeof state !== 'object') continue
    const user = state.user && typeof state.user === 'object' ? state.user : {}
    states.push(h('li', {}, h('span', { class: 'muted' }, `client ${client}: `), shown(user.name ?? state)))
  }
  if (states.length) out.push(h('p', { class: 'muted' }, 'awareness:'), h('ul', { class: 'people' }, states))
  if (out.length === 0) out.push(h('p', { class: 'muted' }, 'nobody'))
  return out
}
