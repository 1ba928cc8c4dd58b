-- exit_list.lua: the exit IPs recorded for a pool's proxies (exit_note.lua),
-- read in bounded calls (issue 14).
--
-- KEYS[1] exit hash   id -> exit IP
-- KEYS[2] pool hash   id -> proxy URL (ARGV[1] "count" only)
-- KEYS[3] meta hash   "version", the pool's generation (ARGV[1] "count" only)
-- ARGV[1] "count": return {proxies in the pool, exits recorded, the pool's
--         generation (0 for none)} (two HLENs and an HGET: the checker's
--         cheap look for proxies without an exit); "page":
--         return one HSCAN page of the exit hash, {next cursor ("0" after
--         the last page), id 1, IP 1, id 2, IP 2, ...}; an id may come
--         twice over the pages (the caller keeps the last)
-- ARGV[2] "page": HSCAN cursor, "0" for the first page
-- ARGV[3] "page": HSCAN count
if ARGV[1] == 'count' then
  return {redis.call('HLEN', KEYS[2]), redis.call('HLEN', KEYS[1]), tonumber(redis.call('HGET', KEYS[3], 'version') or '0') or 0}
end
if ARGV[1] ~= 'page' then return redis.error_reply('PSARGS exit_list wants "count" or "page"') end
local page = redis.call('HSCAN', KEYS[1], ARGV[2], 'COUNT', ARGV[3])
local out = {page[1]}
for _, v in ipairs(page[2]) do out[#out + 1] = v end
return out
