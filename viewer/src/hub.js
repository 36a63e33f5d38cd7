// The hub's crdtstore channel: a second WebSocket (subprotocol "crdtstore") that carries the
// extension requests (message type 100: journal.read, lease.status, ...) and the hub's pushes
// (the journal head with its new entries, "the tenant's leases changed").
import * as encoding from 'lib0/encoding'
import * as decoding from 'lib0/decoding'

const EXTENSION = 100
const REQUEST = 0
const RESPONSE = 1
const PUSH = 2

export class HubError extends Error {
  constructor (code, message) {
    super(`${code}: ${message}`)
    this.code = code
  }
}

export class HubChannel {
  /**
   * @param {string} url ws://host/<tenant>/<run>
   * @param {string} token a read-only token
   * @param {{onPush: function(object):void, onOpen: function():void, onClose: function(CloseEvent):void}} handlers
   */
  constructor (url, token, handlers) {
    this.pending = new Map()
    this.nextId = 1
    this.handlers = handlers
    this.ws = new WebSocket(`${url}?token=${encodeURIComponent(token)}`, ['crdtstore'])
    this.ws.binaryType = 'arraybuffer'
    this.ws.onopen = () => handlers.onOpen()
    this.ws.onmessage = (event) => this._receive(new Uint8Array(event.data))
    this.ws.onclose = (event) => {
      for (const { reject } of this.pending.values()) {
        reject(new HubError('CLOSED', event.reason || `connection closed (${event.code})`))
      }
      this.pending.clear()
      handlers.onClose(event)
    }
  }

  /** Send one request; resolves with its result, rejects with a HubError. */
  request (op, params = {}) {
    const id = this.nextId++
    const encoder = encoding.createEncoder()
    encoding.writeVarUint(encoder, EXTENSION)
    encoding.writeVarUint(encoder, REQUEST)
    encoding.writeVarString(encoder, JSON.stringify({ id, op, params }))
    return new Promise((resolve, reject) => {
      if (this.ws.readyState !== WebSocket.OPEN) {
        reject(new HubError('CLOSED', 'not connected'))
        return
      }
      this.pending.set(id, { resolve, reject })
      this.ws.send(encoding.toUint8Array(encoder))
    })
  }

  close () {
    this.ws.close()
  }

  _receive (bytes) {
    let message
    try {
      const decoder = decoding.createDecoder(bytes)
      if (decoding.readVarUint(decoder) !== EXTENSION) return // (nothing else is for us)
      const kind = decoding.readVarUint(decoder)
      message = { kind, body: JSON.parse(decoding.readVarString(decoder)) }
    } catch (err) {
      console.warn('crdtstore viewer: a frame it cannot read', err)
      return
    }
    if (message.kind === PUSH) {
      this.handlers.onPush(message.body)
    } else if (message.kind === RESPONSE) {
      const waiting = this.pending.get(message.body.id)
      if (waiting === undefined) return
      this.pending.delete(message.body.id)
      const error = message.body.error
      if (error) waiting.reject(new HubError(error.code, error.message))
      else waiting.resolve(message.body.result)
    }
  }
}
