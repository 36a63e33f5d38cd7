// crdtstore's record viewer: the page the hub serves at /-/view/<tenant>/<run>#token=<ro token>.
//
// It joins the run read-only twice over the hub's own protocol: a y-websocket provider (the
// live record and awareness) and a "crdtstore" channel (the journal's entries with their
// provenance, pushed as they are written; the tenant's leases; who is connected). It takes only
// read-only tokens and builds every piece of data into the page as text.
import * as Y from 'yjs'
import { WebsocketProvider } from 'y-websocket'
import { HubChannel } from './hub.js'
import { Journal } from './journal.js'
import { h, fill, time } from './dom.js'
import * as render from './render.js'

const PREFIX = '/-/view/'
const TOKEN_KEY = 'crdtstore.viewer.token'

const $ = (id) => document.getElementById(id)

const fail = (message) => {
  fill($('error'), message)
  $('error').hidden = false
  document.body.dataset.state = 'refused'
}

/** The claims of a token (not verified here: the hub does), or null. */
const claimsOf = (token) => {
  try {
    const part = token.split('.')[0].replace(/-/g, '+').replace(/_/g, '/')
    return JSON.parse(atob(part + '='.repeat((4 - (part.length % 4)) % 4)))
  } catch {
    return null
  }
}

/** The read-only token from the address (#token=...), then from this tab's session storage;
 * the address loses it at once (no history entry, no Referer keeps it). */
const readToken = () => {
  const params = new URLSearchParams(location.hash.slice(1))
  let token = params.get('token')
  if (token !== null) history.replaceState(null, '', location.pathname + location.search)
  else token = sessionStorage.getItem(TOKEN_KEY)
  if (!token) {
    fail('No token: open the address that `crdtstore view --store URL --run RUN` prints.')
    return null
  }
  const claims = claimsOf(token)
  if (claims === null) {
    fail('The token in the address is not a crdtstore token.')
    return null
  }
  if (claims.mode !== 'ro') {
    sessionStorage.removeItem(TOKEN_KEY)
    fail('This is a read-write token: the viewer takes only read-only tokens (`crdtstore view` prints one). It was not used.')
    return null
  }
  sessionStorage.setItem(TOKEN_KEY, token)
  return { token, claims }
}

const wsBase = () => `${location.protocol === 'https:' ? 'wss' : 'ws'}://${location.host}`

// -- the index of runs ---------------------------------------------------------------------------

const showIndex = async (tenant, token) => {
  document.title = `${tenant} · crdtstore`
  fill($('title'), tenant, h('span', { class: 'muted' }, ' runs'))
  $('run').hidden = true
  $('index').hidden = false
  document.body.dataset.page = 'index'
  const answer = await fetch(`${PREFIX}${encodeURIComponent(tenant)}/?list=runs`, {
    headers: { Authorization: `Bearer ${token}` },
    cache: 'no-store'
  })
  const body = await answer.json().catch(() => null)
  if (!answer.ok) {
    fail(body && body.error ? `${body.error.code}: ${body.error.message}` : `refused (${answer.status})`)
    return
  }
  const runs = body.runs
  if (runs.length === 0) {
    fill($('runs'), h('p', { class: 'muted' }, 'no runs this token may see'))
    return
  }
  fill($('runs'), h('table', { class: 'grid' },
    h('thead', {}, h('tr', {}, ['run', 'state', 'entries', 'created', 'parent'].map((c) => h('th', {}, c)))),
    h('tbody', {}, runs.map((r) => h('tr', { 'data-run': r.run },
      h('td', { class: 'key' }, h('a', { href: `${PREFIX}${encodeURIComponent(tenant)}/${encodeURIComponent(r.run)}` }, r.run)),
      h('td', {}, h('span', { class: `state s-${r.state}` }, String(r.state))),
      h('td', {}, String(r.head)),
      h('td', {}, `${new Date(r.created * 1000).toISOString().slice(0, 19).replace('T', ' ')}`),
      h('td', {}, r.parent || ''))))))
}

// -- one run ---------------------------------------------------------------------------------------

class RunView {
  constructor (tenant, run, token) {
    this.tenant = tenant
    this.run = run
    this.journal = new Journal()
    this.config = null
    this.leaseStatus = null
    this.leasesAt = 0
    this.connections = null
    this.cursor = null // null: follow the head (live); else the position shown
    this.loading = Promise.resolve()
    this.refused = false
    this.scheduled = false

    this.doc = new Y.Doc()
    const room = encodeURIComponent(run)
    this.provider = new WebsocketProvider(`${wsBase()}/${encodeURIComponent(tenant)}`, room, this.doc, {
      params: { token },
      disableBc: true
    })
    this.provider.awareness.setLocalState(null) // (a viewer is not a participant)
    this.provider.on('status', ({ status }) => this.badge('yjs', status))
    this.provider.on('sync', (synced) => synced && this.badge('yjs', 'synced'))
    this.provider.on('closed', (terminal) => terminal && this.refuse(terminal.code, terminal.reason))
    this.doc.on('update', () => this.schedule())
    this.provider.awareness.on('change', () => this.schedule())

    this.token = token
    this.retry = 0
    this.connectHub()
    $('scrubber').addEventListener('input', () => this.scrub(Number($('scrubber').value)))
    $('live').addEventListener('click', () => this.scrub(null))
    document.addEventListener('click', (event) => {
      const target = event.target.closest('a.jump')
      if (target === null) return
      event.preventDefault()
      this.scrub(Number(target.dataset.seq))
    })
    setInterval(() => this.tick(), 1000)
  }

  /** The crdtstore channel, connected again (with backoff) when it drops, until refused. */
  connectHub () {
    const url = `${wsBase()}/${encodeURIComponent(this.tenant)}/${encodeURIComponent(this.run)}`
    this.hub = new HubChannel(url, this.token, {
      onOpen: () => { this.everOpened = true; this.opened() },
      onPush: (push) => this.pushed(push),
      onClose: (event) => {
        this.badge('journal', 'disconnected')
        if (event.code >= 4400 && event.code < 4500) this.refuse(event.code, event.reason)
        if (this.refused) return
        if (!this.everOpened && this.retry === 0) this.diagnose()
        const delay = Math.min(5000, 100 * 2 ** this.retry++)
        setTimeout(() => this.refused || this.connectHub(), delay)
      }
    })
  }

  /** The channel never opened and the hub said nothing (it refuses at the HTTP upgrade, or is
   * not there): ask its index of runs why, and stop if the token is refused. */
  async diagnose () {
    let answer, body
    try {
      answer = await fetch(`${PREFIX}${encodeURIComponent(this.tenant)}/?list=runs`, {
        headers: { Authorization: `Bearer ${this.token}` },
        cache: 'no-store'
      })
      body = await answer.json()
    } catch {
      return // (the hub is not there: keep trying)
    }
    if (!answer.ok && body && body.error) {
      this.refuse(answer.status, `${body.error.code}: ${body.error.message}`)
    } else if (answer.ok && !body.runs.some((r) => r.run === this.run)) {
      const claims = claimsOf(this.token) || {}
      const scope = String(claims.run || '')
      const covers = scope.endsWith('*') ? this.run.startsWith(scope.slice(0, -1)) : scope === this.run
      this.refuse(covers ? 4404 : 403, covers
        ? `UNKNOWN_RUN: no run ${this.run}`
        : `FORBIDDEN: the token is for ${claims.tenant}/${claims.run}, not ${this.tenant}/${this.run}`)
    }
  }

  badge (which, status) {
    const el = $(`status-${which}`)
    fill(el, `${which === 'yjs' ? 'record' : 'journal'}: ${status}`)
    el.dataset.status = status
  }

  refuse (code, reason) {
    if (this.refused) return
    this.refused = true
    this.provider.destroy()
    if (this.hub) this.hub.close()
    this.doc = new Y.Doc()
    this.journal = new Journal()
    $('run').hidden = true
    const why = reason || `close code ${code}`
    fail(code === 4404
      ? `There is no run ${this.run} in tenant ${this.tenant} (yet): ${why}`
      : `The hub refused this token for ${this.tenant}/${this.run}: ${why}`)
  }

  async opened () {
    this.badge('journal', 'connected')
    this.retry = 0
    try {
      const [config, snapshot, connections, probe] = await Promise.all([
        this.hub.request('config.get'),
        this.hub.request('journal.snapshot'),
        this.hub.request('view.connections'),
        this.hub.request('journal.read', { after: 0, limit: 1 })
      ])
      this.config = config
      this.connections = connections
      // the journal's first entries were dropped into the snapshot: start from it
      const firstKept = probe.rows.length ? probe.rows[0][0] : null
      const dropped = snapshot && (firstKept === null ? snapshot.seq > 0 : firstKept > 1)
      if (dropped && this.journal.head < snapshot.seq) this.journal.setBase(snapshot)
      this.catchUp()
      this.refreshLeases()
    } catch (err) {
      if (!this.refused) fail(String(err.message || err))
    }
  }

  /** Read the journal from the head held up to where the hub's is (one reader at a time). */
  catchUp () {
    this.loading = this.loading.then(async () => {
      for (;;) {
        const answer = await this.hub.request('journal.read', { after: this.journal.head, limit: 1000 })
        this.journal.add(answer.rows)
        this.schedule()
        if (!answer.more || answer.rows.length === 0) break
      }
    }).catch((err) => console.warn('crdtstore viewer: journal read', err))
  }

  pushed (push) {
    if (push.push === 'head') {
      if (Array.isArray(push.rows) && push.rows.length && push.rows[0][0] <= this.journal.head + 1) {
        this.journal.add(push.rows)
        this.schedule()
      }
      if (push.seq > this.journal.head) this.catchUp()
      this.refreshConnections() // (a new writer is often a new connection)
    } else if (push.push === 'leases') {
      this.refreshLeases()
    }
  }

  async refreshLeases () {
    if (this.leasesAsked) {
      this.leasesAgain = true // (asked while a request is out: ask once more after it)
      return
    }
    this.leasesAsked = true
    try {
      const [status, connections] = await Promise.all([
        this.hub.request('lease.status'),
        this.hub.request('view.connections')
      ])
      this.leaseStatus = status
      this.leasesAt = Date.now()
      this.connections = connections
      this.schedule()
    } catch (err) {
      console.warn('crdtstore viewer: lease status', err)
    } finally {
      this.leasesAsked = false
    }
    if (this.leasesAgain) {
      this.leasesAgain = false
      this.refreshLeases()
    }
  }

  refreshConnections () {
    if (this.connectionsAsked) return
    this.connectionsAsked = true
    this.hub.request('view.connections').then((connections) => {
      this.connections = connections
      this.schedule()
    }).catch(() => {}).finally(() => { this.connectionsAsked = false })
  }

  tick () {
    if (this.refused || this.hub.ws.readyState !== WebSocket.OPEN) return
    // the hub pushes lease hand-offs only (a new request, a grant to the asker itself and a
    // lapse by TTL wake no one): the table is asked for again every second too
    this.refreshLeases()
  }

  scrub (position) {
    this.cursor = position === null || position >= this.journal.head ? null : Math.max(position, this.journal.start)
    this.schedule()
  }

  schedule () {
    if (this.scheduled || this.refused) return
    this.scheduled = true
    requestAnimationFrame(() => {
      this.scheduled = false
      this.draw()
    })
  }

  draw () {
    const j = this.journal
    const live = this.cursor === null
    const at = live ? j.head : this.cursor
    const doc = live ? this.doc : j.docAt(at)
    const prov = j.provenance(at)
    const kinds = render.collectionsOf(doc)
    document.body.dataset.mode = live ? 'live' : 'past'
    document.body.dataset.head = String(j.head)
    document.body.dataset.position = String(at)

    const scrubber = $('scrubber')
    scrubber.min = String(j.start)
    scrubber.max = String(j.head)
    scrubber.value = String(at)
    scrubber.disabled = j.head === j.start
    const row = j.row(at)
    fill($('position'), live
      ? h('span', {}, h('b', {}, `live`), ` · position ${at} of ${j.head}`)
      : h('span', {}, h('b', {}, `position ${at}`), ` of ${j.head}${row ? ' · ' + time(row.wallTime) : ''}`))
    $('live').hidden = live
    $('past-banner').hidden = live
    fill($('past-banner'), `The record as it was at journal position ${at} (of ${j.head}). Move the scrubber to the right end, or press “back to live”.`)

    fill($('entry'), ...(row === null && j.base !== null && at === j.first
      ? [h('p', { class: 'muted' }, `the snapshot: the entries up to #${at} merged by compaction`)]
      : render.entry(row)))
    fill($('collections'), ...render.collections(doc, prov, j.clients, this.config))
    const steps = render.steps(doc, kinds)
    $('steps-section').hidden = steps === null
    if (steps !== null) fill($('steps'), ...steps)
    fill($('leases'), ...render.leases(this.leaseStatus, this.leasesAt, Date.now()))
    fill($('presence'), ...render.presence(this.connections, this.provider.awareness.getStates(), this.doc.clientID))
  }
}

const main = () => {
  const path = location.pathname.startsWith(PREFIX) ? location.pathname.slice(PREFIX.length) : ''
  const parts = path.split('/').map((p) => {
    try { return decodeURIComponent(p) } catch { return '' }
  })
  const given = readToken()
  if (given === null) return
  const tenant = parts[0] || given.claims.tenant
  if (parts.length < 2 || parts[1] === '') {
    showIndex(tenant, given.token).catch((err) => fail(String(err.message || err)))
    return
  }
  const run = parts.slice(1).join('/')
  document.title = `${run} · ${tenant} · crdtstore`
  fill($('title'), h('a', { href: `${PREFIX}${encodeURIComponent(tenant)}/` }, tenant), ' / ', run)
  $('index').hidden = true
  $('run').hidden = false
  window.crdtstoreViewer = new RunView(tenant, run, given.token)
}

main()
