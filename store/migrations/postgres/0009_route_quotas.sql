-- Version 9: each provider route's rate limits and their buckets, shared by
-- every process (docs/design.md section 15, "Rate limits"). A route names
-- provider, endpoint, key fingerprint and model; never a key.
CREATE TABLE route_quotas (
    route text PRIMARY KEY,
    buckets jsonb NOT NULL,
    updated_at bigint NOT NULL
);
