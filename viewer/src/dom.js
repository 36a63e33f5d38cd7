// Building the page's DOM. Every piece of data goes in as a text node or an attribute value
// (never as markup): a value holding HTML or script shows as text and runs nothing.
import * as Y from 'yjs'

/**
 * An element: h('td', {class: 'value', title: full}, 'text', child, ...).
 * Attributes are set with setAttribute (on* handlers and style are refused).
 */
export const h = (tag, attrs = {}, ...children) => {
  const el = document.createElement(tag)
  for (const [name, value] of Object.entries(attrs)) {
    if (value === null || value === undefined || value === false) continue
    if (/^on/i.test(name) || name === 'style') throw new Error(`attribute ${name} is not allowed`)
    el.setAttribute(name, value === true ? '' : String(value))
  }
  append(el, children)
  return el
}

const append = (el, children) => {
  for (const child of children) {
    if (child === null || child === undefined || child === false) continue
    if (Array.isArray(child)) append(el, child)
    else if (child instanceof Node) el.appendChild(child)
    else el.appendChild(document.createTextNode(String(child)))
  }
}

/** Replace the children of `el` with `children`. */
export const fill = (el, ...children) => {
  el.replaceChildren()
  append(el, children)
  return el
}

const MAX_SHOWN = 400

const sortedKeys = (value) => {
  // what only a plain Yjs client can store: a nested shared type (its JSON), binary
  if (value instanceof Y.AbstractType) return sortedKeys(value.toJSON())
  if (value instanceof Uint8Array) return `<${value.length} bytes>`
  if (Array.isArray(value)) return value.map(sortedKeys)
  if (value === null || typeof value !== 'object') return value
  const out = {}
  for (const key of Object.keys(value).sort()) out[key] = sortedKeys(value[key])
  return out
}

/** JSON with every object's keys sorted (the same value always reads the same). */
export const json = (value) => {
  const text = JSON.stringify(sortedKeys(value))
  return text === undefined ? String(value) : text
}

/** A value as text: strings as they are, anything else as JSON. */
export const shown = (value) =>
  typeof value === 'string' ? value : value instanceof Uint8Array ? `<${value.length} bytes>` : json(value)

export const valueCell = (value, cls = 'value') => {
  const text = shown(value)
  const cut = text.length > MAX_SHOWN ? text.slice(0, MAX_SHOWN) + '…' : text
  return h('td', { class: `${cls} ${typeof value === 'string' ? 'str' : 'json'}`, title: cut === text ? null : text.slice(0, 4000) }, cut)
}

/** A stable colour per agent (hue from a hash of its name). */
export const hue = (agent) => {
  let x = 2166136261
  for (let i = 0; i < agent.length; i++) {
    x ^= agent.charCodeAt(i)
    x = Math.imul(x, 16777619) >>> 0
  }
  return x % 360
}

const HUE_CLASSES = 24 // (CSS classes a0..a23: the CSP allows no inline style)

export const agentClass = (agent) => `a${Math.floor(hue(agent) / (360 / HUE_CLASSES))}`

export const agentChip = (agent, extra = '') =>
  h('span', { class: `agent ${agentClass(agent)} ${extra}`.trim(), 'data-agent': agent }, agent)

export const time = (wallTime) => {
  if (typeof wallTime !== 'number' || !isFinite(wallTime)) return ''
  const d = new Date(wallTime * 1000)
  return d.toISOString().slice(11, 23)
}

export const seconds = (s) => {
  if (typeof s !== 'number' || !isFinite(s)) return ''
  const sign = s < 0 ? '-' : ''
  s = Math.abs(s)
  if (s < 60) return `${sign}${s.toFixed(1)} s`
  if (s < 3600) return `${sign}${Math.floor(s / 60)} min ${Math.round(s % 60)} s`
  return `${sign}${(s / 3600).toFixed(1)} h`
}
