-- Version 7: each provider route's rate limits and their buckets
-- (docs/design.md section 15, "Rate limits").
CREATE TABLE route_quotas (
    route text PRIMARY KEY,
    buckets text NOT NULL,
    updated_at integer NOT NULL
);
