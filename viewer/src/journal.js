// The run's journal as the viewer holds it: the entries read from the hub, who wrote what
// (provenance per map key, Yjs client id -> agent), and the record as it was at a position.
import * as Y from 'yjs'

export const MAX_ROWS = 50000 // entries kept in the page (older ones are merged into the base)
const CHECKPOINT_EVERY = 500 // positions between the saved states docAt starts from

const fromBase64 = (text) => {
  const bin = atob(text)
  const out = new Uint8Array(bin.length)
  for (let i = 0; i < bin.length; i++) out[i] = bin.charCodeAt(i)
  return out
}

/** A journal row as the hub sends it: [seq, agent, source, client_id, wall_time, update,
 * effect, checksum, origin, call?] */
const parseRow = (row) => ({
  seq: row[0],
  agent: String(row[1]),
  source: String(row[2]),
  clientId: row[3],
  wallTime: row[4],
  update: fromBase64(row[5]),
  effect: Array.isArray(row[6]) ? row[6] : [],
  origin: row[8] ? String(row[8]) : '',
  call: row.length > 9 && row[9] ? String(row[9]) : ''
})

/** Record in `prov` (collection -> key -> {row, op, value}) the map keys `row` wrote. */
const note = (prov, row) => {
  for (const op of row.effect) {
    if (!Array.isArray(op) || op[0] !== 'map' || op.length < 4) continue
    let keys = prov.get(op[1])
    if (keys === undefined) prov.set(op[1], (keys = new Map()))
    keys.set(op[3], { row, op: op[2], value: op[4] })
  }
}

export class Journal {
  constructor () {
    this.base = null // {seq, update}: the snapshot the entries start after (null: none)
    this.first = 0 // the position before the first entry held
    this.rows = [] // contiguous, rows[i].seq === this.first + i + 1
    this.clients = new Map() // Yjs client id -> agent (from the entries' updates)
    this.latest = new Map() // the provenance at the head (kept as rows come, see provenance)
    this._doc = null // the record at this._docAt (see docAt)
    this._docAt = -1
    this._checkpoints = new Map() // position -> the record's state there (docAt)
  }

  get head () {
    return this.first + this.rows.length
  }

  setBase (snapshot) {
    this.base = { seq: snapshot.seq, update: fromBase64(snapshot.update) }
    this.first = snapshot.seq
    this.rows = []
    this.latest = new Map()
    this._doc = null
    this._checkpoints.clear()
  }

  /** Add rows (hub JSON); those not right after the head are ignored. Returns how many. */
  add (rows) {
    let added = 0
    for (const raw of rows) {
      if (!Array.isArray(raw) || raw[0] !== this.head + 1) continue
      const row = parseRow(raw)
      this.rows.push(row)
      added++
      note(this.latest, row)
      try {
        for (const client of Y.parseUpdateMeta(row.update).from.keys()) {
          this.clients.set(client, row.agent)
        }
      } catch (err) {
        console.warn('crdtstore viewer: an entry whose update it cannot read', row.seq, err)
      }
    }
    if (this.rows.length > MAX_ROWS) {
      // the oldest entries go into the base state: the scrubber starts later, nothing is lost
      const dropped = this.rows.splice(0, this.rows.length - MAX_ROWS + CHECKPOINT_EVERY)
      const updates = dropped.map((r) => r.update)
      if (this.base !== null) updates.unshift(this.base.update)
      this.first += dropped.length
      this.base = { seq: this.first, update: Y.mergeUpdates(updates) }
      this._doc = null
      for (const at of this._checkpoints.keys()) if (at < this.first) this._checkpoints.delete(at)
    }
    return added
  }

  row (seq) {
    return this.rows[seq - this.first - 1] || null
  }

  /** The earliest position the scrubber can show. */
  get start () {
    return this.base === null && this.first > 0 ? this.first + 1 : this.first
  }

  /** Provenance at position `at`: collection -> key -> the last entry that set or deleted it
   * (at the head: kept up to date as entries come; before it: read from the entries). */
  provenance (at) {
    if (at >= this.head) return this.latest
    const out = new Map()
    for (let seq = this.first + 1; seq <= at; seq++) note(out, this.rows[seq - this.first - 1])
    return out
  }

  /** A Y.Doc holding the record as it was at position `at` (the snapshot and the entries up
   * to `at`, applied in journal order). */
  docAt (at) {
    const end = Math.max(this.first, Math.min(at, this.head))
    if (this._doc === null || end < this._docAt) {
      // start from the nearest saved state at or before `end` (or the base)
      let from = this.first
      for (const saved of this._checkpoints.keys()) if (saved <= end && saved > from) from = saved
      this._doc = new Y.Doc()
      this._docAt = from
      if (from > this.first) Y.applyUpdate(this._doc, this._checkpoints.get(from))
      else if (this.base !== null) Y.applyUpdate(this._doc, this.base.update)
    }
    for (let seq = this._docAt + 1; seq <= end; seq++) {
      Y.applyUpdate(this._doc, this.row(seq).update)
      if (seq % CHECKPOINT_EVERY === 0 && !this._checkpoints.has(seq)) {
        this._checkpoints.set(seq, Y.encodeStateAsUpdate(this._doc))
      }
    }
    this._docAt = Math.max(this._docAt, end)
    return this._doc
  }
}
