-- Health of a slotune LLMDeployment (slotune.dev/v1alpha1), from the status the operator
-- writes. In the order checked:
--   Progressing  being deleted (a foreground deletion waits for the children to go)
--   Progressing  no status yet, or status.observedGeneration behind metadata.generation
--                (a status left from an older spec says nothing of this one)
--   Degraded     phase Invalid (the message says what to fix), or condition Degraded=True
--   Suspended    spec.replicas 0
--   Progressing  Ready not True, or Progressing=True (a configuration rolling out)
--   Degraded     SLOMet=False, even while a study works on it: what on-call must see
--   Progressing  a study running (status.tuning.state Tuning or Promoting)
--   Healthy      otherwise
-- Lua 5.1 with the base and table libraries only, as Argo CD's gopher-lua offers them.
local hs = {}

local function condition(status, kind)
  if status.conditions == nil then
    return nil
  end
  for _, c in ipairs(status.conditions) do
    if c.type == kind then
      return c
    end
  end
  return nil
end

local function said(c, fallback)
  if c ~= nil and c.message ~= nil and c.message ~= "" then
    return c.message
  end
  return fallback
end

if obj.metadata.deletionTimestamp ~= nil then
  hs.status = "Progressing"
  hs.message = "Being deleted: waiting for its pods and other children to go"
  return hs
end

local status = obj.status
local generation = obj.metadata.generation
if status == nil or status.observedGeneration == nil then
  hs.status = "Progressing"
  hs.message = "Waiting for the slotune operator to observe this LLMDeployment"
  return hs
end
if generation ~= nil and status.observedGeneration < generation then
  hs.status = "Progressing"
  hs.message = "Waiting for the slotune operator to observe generation " .. generation
    .. " (status describes " .. status.observedGeneration .. ")"
  return hs
end

local phase = status.phase or "Unknown"
local ready = condition(status, "Ready")
local degraded = condition(status, "Degraded")
local progressing = condition(status, "Progressing")
local slo = condition(status, "SLOMet")

local state = nil
local study = ""
if status.tuning ~= nil and status.tuning.state ~= nil then
  state = status.tuning.state
  study = "study " .. state
  if status.trialsSummary ~= nil then
    study = study .. ", trials " .. status.trialsSummary
  end
end

if phase == "Invalid" then
  hs.status = "Degraded"
  hs.message = "Invalid spec: " .. said(ready, said(degraded, status.message or "see status"))
  return hs
end
if degraded ~= nil and degraded.status == "True" then
  hs.status = "Degraded"
  hs.message = phase .. ": " .. said(degraded, degraded.reason or "degraded")
  return hs
end
if obj.spec ~= nil and obj.spec.replicas == 0 then
  hs.status = "Suspended"
  hs.message = "Scaled to zero replicas"
  return hs
end
if ready == nil or ready.status ~= "True" then
  hs.status = "Progressing"
  hs.message = phase .. ": " .. said(ready, "waiting for the serving pods")
  return hs
end
if progressing ~= nil and progressing.status == "True" then
  hs.status = "Progressing"
  hs.message = phase .. ": " .. said(progressing, "rolling out")
  return hs
end
if slo ~= nil and slo.status == "False" then
  hs.status = "Degraded"
  hs.message = "SLO missed: " .. said(slo, status.sloSummary or "see status.slo")
  if study ~= "" then
    hs.message = hs.message .. " (" .. study .. ")"
  end
  return hs
end

local parts = { phase, (status.ready or "?") .. " ready" }
if slo ~= nil and slo.status == "True" then
  table.insert(parts, "SLO met")
elseif slo ~= nil then
  table.insert(parts, "SLO not measured yet")
end
if status.sloSummary ~= nil then
  table.insert(parts, "TTFT " .. status.sloSummary)
end
if study ~= "" then
  table.insert(parts, study)
end
hs.message = table.concat(parts, ", ")
if state == "Tuning" or state == "Promoting" then
  hs.status = "Progressing"
else
  hs.status = "Healthy"
end
return hs
