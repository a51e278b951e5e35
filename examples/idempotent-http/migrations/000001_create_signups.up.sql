CREATE TABLE signups (id bigserial PRIMARY KEY, email text NOT NULL);
