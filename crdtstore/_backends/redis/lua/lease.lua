-- The lease table of one tenant and its transitions: crdtstore/_leases/_engine.py (Table) in
-- Lua, so that a transition is one atomic step on the server. Every transition reaps first,
-- then makes its change, then applies the grant rule (_leases/_rule.py): a waiting request
-- is granted when none of its resources is held or wanted by an earlier waiting request.
--
-- The table is kept in indexes, so that a transition touches the requests and resources it
-- concerns, never the whole table: the grant rule holds for a waiting request exactly when,
-- for each of its resources, nobody holds it and the request heads the resource's queue
-- (queues in rank order). A change can only make the heads of the queues of the resources
-- it freed grantable, so those are the only requests the rule looks at again; a grant frees
-- nothing, so it never makes another one possible.
--
-- KEYS[1] q  hash    request id -> JSON list (see decode)
-- KEYS[2] n  hash    rank, token (the next ones: they never go back), boot (of the clock
--                    readings in the requests)
-- KEYS[3] ev stream  an entry per transition that granted another request than the
--                    caller's, for waiters in other processes
-- KEYS[4] h  hash    resource -> id of the request holding it
-- KEYS[5] w  zset    the queues: "resource NUL rank (20 digits) NUL id" of every waiting
--                    request and each of its resources, at score 0 (lexicographic)
-- KEYS[6] x  zset    request id -> its deadline (what the reap reads)
-- KEYS[7] k  hash    "owner NUL step NUL attempt" -> request id (re-attach by key)
-- ARGV[1] op, ARGV[2] now ('' = this server's TIME, boot 'redis'), ARGV[3] boot, ARGV[4...]
--
-- Reply: {'ok', now, boot, grants to others, result, next token[, the request's id, state,
-- token, deadline, JSON[, every request's JSON when it waits]]} or {'err', now, boot, grants
-- to others, kind, args...}.
local Q, N, EV, H, W, X, K = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7]
local op = ARGV[1]
local now, boot
if ARGV[2] == '' then
  local t = redis.call('TIME')
  now = tonumber(t[1]) + tonumber(t[2]) / 1000000
  boot = 'redis'
else
  now = tonumber(ARGV[2])
  boot = ARGV[3]
end

local function num(x) return string.format('%.17g', x) end
local function int(x) return string.format('%d', x) end

-- a request: [rank, id, owner, step, attempt, resources, state, token, ttl, host, proc boot,
-- pid, proc start, acked, created, clock boot, requested, granted at, expires] ('' for none;
-- numbers as strings: cjson keeps 14 digits only)
local function decode(raw)
  local a = cjson.decode(raw)
  return {
    rank = tonumber(a[1]), id = a[2], owner = a[3], step = a[4], attempt = a[5],
    resources = a[6], state = a[7], token = tonumber(a[8]), ttl = tonumber(a[9]),
    host = a[10], pboot = a[11], pid = a[12], pstart = a[13], acked = a[14] == '1',
    created = a[15], clock_boot = a[16], requested = tonumber(a[17]),
    granted_at = tonumber(a[18]), expires = tonumber(a[19]),
  }
end

local function encode(r)
  return cjson.encode({
    int(r.rank), r.id, r.owner, r.step, r.attempt, r.resources, r.state,
    r.token and int(r.token) or '', num(r.ttl), r.host, r.pboot, r.pid, r.pstart,
    r.acked and '1' or '0', r.created, r.clock_boot, num(r.requested),
    r.granted_at and num(r.granted_at) or '', num(r.expires),
  })
end

local counters = redis.call('HMGET', N, 'rank', 'token', 'boot')
local next_rank, next_token = tonumber(counters[1]) or 1, tonumber(counters[2]) or 1
local cache, dirty, gone = {}, {}, {} -- requests read, to write back, removed (by id)
local touched = {} -- resources freed (a holder or a waiter left): their queues' heads may go
local counters_dirty, grants, granted_now = false, 0, {}

local function get(id)
  if gone[id] then return nil end
  local r = cache[id]
  if r == nil then
    local raw = redis.call('HGET', Q, id)
    if not raw then return nil end
    r = decode(raw)
    cache[id] = r
  end
  return r
end

local function member(x, r) return x .. '\0' .. string.format('%020d', r.rank) .. '\0' .. r.id end

-- the ids of the first `count` waiters of resource x (rank order)
local function queue(x, count)
  local out = {}
  for i, m in ipairs(redis.call('ZRANGEBYLEX', W, '[' .. x .. '\0', '(' .. x .. '\1',
      'LIMIT', 0, count)) do
    out[i] = string.sub(m, #x + 23)
  end
  return out
end

local function key_field(owner, step, attempt) return owner .. '\0' .. step .. '\0' .. attempt end

local function remove(r)
  for _, x in ipairs(r.resources) do
    if r.state == 'granted' then
      if redis.call('HGET', H, x) == r.id then redis.call('HDEL', H, x) end
    else
      redis.call('ZREM', W, member(x, r))
    end
    touched[x] = true
  end
  redis.call('HDEL', Q, r.id)
  redis.call('ZREM', X, r.id)
  if r.step ~= '' then
    local kf = key_field(r.owner, r.step, r.attempt)
    if redis.call('HGET', K, kf) == r.id then redis.call('HDEL', K, kf) end
  end
  gone[r.id], dirty[r.id] = true, nil
end

local function give(r)
  r.state, r.token, r.granted_at = 'granted', next_token, now
  -- the holder has one TTL from the hand-off to notice (it may be restarting)
  r.expires, r.acked = now + r.ttl, false
  next_token = next_token + 1
  counters_dirty = true
  dirty[r.id] = r
  grants = grants + 1
  granted_now[r.id] = true
  for _, x in ipairs(r.resources) do redis.call('HSET', H, x, r.id) end
end

-- grant the heads of the queues of the freed resources that the rule now lets through
local function grant_freed()
  local cands, seen = {}, {}
  for x in pairs(touched) do
    if redis.call('HEXISTS', H, x) == 0 then
      local id = queue(x, 1)[1]
      if id and not seen[id] then
        seen[id] = true
        local r = get(id)
        if r then cands[#cands + 1] = r end
      end
    end
  end
  touched = {}
  table.sort(cands, function(a, b) return a.rank < b.rank end)
  for _, r in ipairs(cands) do
    local free = true
    for _, x in ipairs(r.resources) do
      if redis.call('HEXISTS', H, x) == 1 or queue(x, 1)[1] ~= r.id then
        free = false
        break
      end
    end
    if free then
      for _, x in ipairs(r.resources) do redis.call('ZREM', W, member(x, r)) end
      give(r)
    end
  end
end

local function reap(dead)
  local out, n = {}, 0
  local function drop(r)
    if not out[r.id] then
      out[r.id] = r
      n = n + 1
    end
  end
  if counters[3] ~= boot then
    -- the clock rebooted (or the table is new): the deadlines of another boot mean nothing
    for _, raw in ipairs(redis.call('HVALS', Q)) do
      local r = decode(raw)
      cache[r.id] = r
      if r.clock_boot ~= boot then
        if r.state == 'granted' then
          drop(r)
        else
          -- a waiter's place survives a reboot: its deadline restarts on this boot's clock
          r.clock_boot, r.requested, r.expires = boot, now, now + r.ttl
          dirty[r.id] = r
        end
      end
    end
    redis.call('HSET', N, 'boot', boot)
  end
  for _, id in ipairs(redis.call('ZRANGEBYSCORE', X, '-inf', num(now))) do
    local r = get(id)
    if r and r.expires <= now then drop(r) end -- (a rebased waiter's is not stored yet)
  end
  for id, pid in pairs(dead) do
    local r = get(id)
    if r and r.state == 'granted' and r.acked and r.pid == pid and r.clock_boot == boot then
      drop(r)
    end
  end
  for _, r in pairs(out) do remove(r) end
  return n
end

-- why r (not granted, wait=False) is refused: the holder of one of its resources, the
-- earliest, else the earliest other waiter for one
local function conflict(r)
  local mine, best = {}, nil
  for _, x in ipairs(r.resources) do mine[x] = true end
  for _, x in ipairs(r.resources) do
    local id = redis.call('HGET', H, x)
    local o = id and get(id)
    if o and o.id ~= r.id and (not best or o.rank < best.rank) then best = o end
  end
  if not best then
    for _, x in ipairs(r.resources) do
      for _, id in ipairs(queue(x, 2)) do
        local o = id ~= r.id and get(id)
        if o then
          if not best or o.rank < best.rank then best = o end
          break
        end
      end
    end
  end
  if not best then return {'held', r.resources[1], 'unknown', ''} end
  local common = {}
  for _, x in ipairs(best.resources) do
    if mine[x] then common[#common + 1] = x end
  end
  table.sort(common)
  if best.state == 'granted' then return {'held', common[1], best.owner, int(best.token)} end
  return {'held', common[1], best.owner .. ' (queued earlier, rank ' .. int(best.rank) .. ')', ''}
end

-- the request ``id`` of ``owner``, or nil and the error
local function mine(id, owner)
  local r = get(id)
  if not r then return nil, {'not_found', id} end
  if r.owner ~= owner then return nil, {'not_owner', id} end
  return r, nil
end

local function attach(r, at)
  r.host, r.pboot, r.pid, r.pstart = ARGV[at], ARGV[at + 1], ARGV[at + 2], ARGV[at + 3]
end

local result, err, target = '', nil, nil
if op == 'request' then
  -- ARGV[4] owner, [5] step, [6] attempt, [7] ttl, [8..11] proc, [12] wait, [13] new id,
  -- [14] created, [15...] the resources (canonical, sorted)
  reap({})
  local owner, step, attempt = ARGV[4], ARGV[5], ARGV[6]
  local ttl, wait = tonumber(ARGV[7]), ARGV[12] == '1'
  local resources = {}
  for i = 15, #ARGV do resources[#resources + 1] = ARGV[i] end
  local r, fresh = nil, false
  if step ~= '' then
    local id = redis.call('HGET', K, key_field(owner, step, attempt))
    if id then r = get(id) end
  end
  -- (the new id already there: a resend of this request after its reply was lost)
  if not r then
    r = get(ARGV[13])
    if r and r.owner ~= owner then r = nil end
  end
  if r then
    local same = #r.resources == #resources
    for i, x in ipairs(resources) do
      if r.resources[i] ~= x then same = false end
    end
    if not same then
      err = {'invalid_resource', cjson.encode(r.resources)}
    else
      attach(r, 8)
      r.ttl, r.expires = ttl, now + ttl
      dirty[r.id] = r
    end
  else
    r = {
      rank = next_rank, id = ARGV[13], owner = owner, step = step, attempt = attempt,
      resources = resources, state = 'waiting', token = nil, ttl = ttl, acked = false,
      created = ARGV[14], clock_boot = boot, requested = now, granted_at = nil,
      expires = now + ttl,
    }
    attach(r, 8)
    next_rank = next_rank + 1
    counters_dirty = true
    fresh = true
  end
  grant_freed() -- the hand-offs the reap made possible (all of earlier ranks)
  if not err then
    if fresh then
      -- the newest request: the rule grants it when none of its resources is held or queued
      local free = true
      for _, x in ipairs(r.resources) do
        if redis.call('HEXISTS', H, x) == 1 or queue(x, 1)[1] then
          free = false
          break
        end
      end
      if free then
        give(r)
      elseif wait then
        for _, x in ipairs(r.resources) do redis.call('ZADD', W, 0, member(x, r)) end
        dirty[r.id] = r
      end
      if step ~= '' and (free or wait) then
        redis.call('HSET', K, key_field(owner, step, attempt), r.id)
      end
    end
    if r.state == 'granted' then
      r.acked = true
    elseif not wait then
      err = conflict(r)
      if not fresh then remove(r) end
    end
    if not err then
      target = r
      result = int(r.rank)
    end
  end
elseif op == 'heartbeat' then
  reap({})
  local r
  r, err = mine(ARGV[4], ARGV[5])
  if r then
    attach(r, 6)
    r.expires = now + r.ttl
    dirty[r.id] = r
    grant_freed()
    if r.state == 'granted' then r.acked = true end
    target = r
    result = int(r.rank)
  end
elseif op == 'release' then
  -- ARGV[4] id, [5] owner, [6] token ('' any), [7] '1' on a resend after a lost reply (the
  -- first send may have removed the request: not finding it then is the release done)
  reap({})
  local r
  r, err = mine(ARGV[4], ARGV[5])
  if err and err[1] == 'not_found' and ARGV[7] == '1' then err = nil end
  if r then
    local token = ARGV[6]
    if r.state ~= 'granted' then
      err = {'lost', r.resources[1], 'not granted (still waiting); cancel it instead', ''}
    elseif token ~= '' and tonumber(token) ~= r.token then
      err = {'lost', r.resources[1], 'token ' .. token .. " is not this grant's token", token}
    else
      remove(r)
    end
  end
elseif op == 'cancel' then
  reap({})
  local r
  r, err = mine(ARGV[4], ARGV[5])
  result = '0'
  if err and err[1] == 'not_found' then err = nil end
  if r then
    remove(r)
    result = '1'
  end
elseif op == 'reap' then
  local dead = {}
  for i = 4, #ARGV, 2 do dead[ARGV[i]] = ARGV[i + 1] end
  result = int(reap(dead))
else
  return redis.error_reply('unknown lease op ' .. tostring(op))
end

grant_freed()
local written = {}
for id, r in pairs(dirty) do
  written[id] = encode(r)
  redis.call('HSET', Q, id, written[id])
  redis.call('ZADD', X, num(r.expires), id)
end
if counters_dirty then
  redis.call('HSET', N, 'rank', int(next_rank), 'token', int(next_token))
end
local others = grants
if target and granted_now[target.id] then others = others - 1 end
if others > 0 then redis.call('XADD', EV, 'MAXLEN', '32', '*', 'g', int(others)) end
if err then
  local out = {'err', num(now), boot, int(others)}
  for _, x in ipairs(err) do out[#out + 1] = x end
  return out
end
local out = {'ok', num(now), boot, int(others), result, int(next_token)}
if target then
  local r = target
  out[7], out[8], out[9], out[10] = r.id, r.state, r.token and int(r.token) or '', num(r.expires)
  out[11] = written[r.id] or encode(r)
  if r.state ~= 'granted' then
    -- a waiter's hints (wake_in, watch_pids) look at every request ahead of it
    for _, raw in ipairs(redis.call('HVALS', Q)) do out[#out + 1] = raw end
  end
end
return out
