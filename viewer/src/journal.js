// The run's journal as the viewer holds it: the entries read from the hub, who wrote what
// (provenance per map key, Yjs client id -> agent), and the record as it was at a position.
import * as Y from 'yjs'

export const MAX_ROWS = 50000 // entries kept in the page (older ones: the scrubber starts later)

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

export class Journal {
  constructor () {
    this.base = null // {seq, update}: the snapshot the entries start after (null: none)
    this.first = 0 // the position before the first entry held
    this.rows = [] // contiguous, rows[i].seq === this.first + i + 1
    this.clients = new Map() // Yjs client id -> agent (from the entries' updates)
    this._doc = null // the record at this._docAt (see docAt)
    this._docAt = -1
  }

  get head () {
    return this.first + this.rows.length
  }

  setBase (snapshot) {
    this.base = { seq: snapshot.seq, update: fromBase64(snapshot.update) }
    this.first = snapshot.seq
    this.rows = []
    this._doc = null
  }

  /** Add rows (hub JSON); those not right after the head are ignored. Returns how many. */
  add (rows) {
    let added = 0
    for (const raw of rows) {
      if (!Array.isArray(raw) || raw[0] !== this.head + 1) continue
      const row = parseRow(raw)
      this.rows.push(row)
      added++
      try {
        for (const client of Y.parseUpdateMeta(row.update).from.keys()) {
          this.clients.set(client, row.agent)
        }
      } catch (err) {
        console.warn('crdtstore viewer: an entry whose update it cannot read', row.seq, err)
      }
    }
    if (this.rows.length > MAX_ROWS) {
      const drop = this.rows.length - MAX_ROWS
      this.rows.splice(0, drop)
      this.first += drop
      this.base = null // (positions before the first held row are no longer reachable)
      this._doc = null
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

  /** Provenance at position `at`: collection -> key -> the last entry that set or deleted it. */
  provenance (at) {
    const out = new Map()
    const end = Math.min(at, this.head)
    for (let seq = this.first + 1; seq <= end; seq++) {
      const row = this.rows[seq - this.first - 1]
      for (const op of row.effect) {
        if (!Array.isArray(op) || op[0] !== 'map' || op.length < 4) continue
        let keys = out.get(op[1])
        if (keys === undefined) out.set(op[1], (keys = new Map()))
        keys.set(op[3], { row, op: op[2], value: op[4] })
      }
    }
    return out
  }

  /** A Y.Doc holding the record as it was at position `at` (the snapshot and the entries up
   * to `at`, applied in journal order). */
  docAt (at) {
    if (this._doc === null || at < this._docAt) {
      this._doc = new Y.Doc()
      this._docAt = this.first
      if (this.base !== null) Y.applyUpdate(this._doc, this.base.update)
    }
    const end = Math.min(at, this.head)
    Y.transact(this._doc, () => {
      for (let seq = this._docAt + 1; seq <= end; seq++) {
        Y.applyUpdate(this._doc, this.row(seq).update)
      }
    })
    this._docAt = Math.max(this._docAt, end)
    return this._doc
  }
}
