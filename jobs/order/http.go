package order

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"strconv"
	"strings"
	"unicode"

	"github.com/fenceq/fenceq/idempotency"
	"github.com/fenceq/fenceq/queue"
)

// HTTP API.
const (
	// HeaderIdempotencyKey carries the client's key on POST /orders.
	HeaderIdempotencyKey = "Idempotency-Key"
	// HeaderReplayed is "true" on a response replayed from an earlier request.
	HeaderReplayed = "Idempotent-Replayed"
	// MaxBodyBytes bounds a request body.
	MaxBodyBytes = 64 << 10
)

// Error codes of the JSON error body {"error": {"code": …, "message": …}}.
const (
	CodeMissingKey           = "missing_idempotency_key" // 400
	CodeInvalidKey           = "invalid_idempotency_key" // 400: empty, over 255 bytes, not printable, repeated
	CodeInvalidBody          = "invalid_body"            // 400: malformed, unknown field, failed validation
	CodeBodyTooLarge         = "body_too_large"          // 400: over MaxBodyBytes
	CodeUnsupportedMediaType = "unsupported_media_type"  // 415: Content-Type set and not application/json
	CodeKeyReused            = "idempotency_key_reused"  // 422
	CodeInFlight             = "request_in_flight"       // 409: retry later with the same key
	CodeInvalidID            = "invalid_order_id"        // 400
	CodeNotFound             = "not_found"               // 404: no such order, or no such path
	CodeMethodNotAllowed     = "method_not_allowed"      // 405: see the Allow header
	CodeInternal             = "internal"                // 500: retry with the same key
)

// ErrorBody is the JSON body of every error response.
type ErrorBody struct {
	Error ErrorDetail `json:"error"`
}

// ErrorDetail is the error inside ErrorBody.
type ErrorDetail struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

// Handler serves the order API:
//
//	POST /orders       Idempotency-Key header, JSON Request body → 201 + Order
//	                   (a replay: the same status and body, Idempotent-Replayed: true)
//	GET  /orders/{id}  → 200 + Order
//
// Errors are JSON ErrorBody values with the Code* codes above, including another method
// on these paths (405, with Allow) and any other path (404).
func (s *Service) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /orders", s.handlePlace)
	mux.HandleFunc("GET /orders/{id}", s.handleGet)
	// The patterns without a method match what the ones above do not: ServeMux's own
	// replies would be plain text.
	mux.HandleFunc("/orders", methodNotAllowed("POST"))
	mux.HandleFunc("/orders/{id}", methodNotAllowed("GET, HEAD"))
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, http.StatusNotFound, CodeNotFound, fmt.Sprintf("no such path: %s", r.URL.Path))
	})
	return mux
}

func methodNotAllowed(allow string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Allow", allow)
		writeError(w, http.StatusMethodNotAllowed, CodeMethodNotAllowed,
			fmt.Sprintf("%s %s is not served; use %s", r.Method, r.URL.Path, allow))
	}
}

func (s *Service) handlePlace(w http.ResponseWriter, r *http.Request) {
	keys := r.Header.Values(HeaderIdempotencyKey)
	switch {
	case len(keys) == 0:
		writeError(w, http.StatusBadRequest, CodeMissingKey, "the Idempotency-Key header is required")
		return
	case len(keys) > 1:
		writeError(w, http.StatusBadRequest, CodeInvalidKey, "send exactly one Idempotency-Key header")
		return
	}
	key := keys[0]
	if err := queue.ValidateUniqueKey("Idempotency-Key", key); err != nil {
		writeError(w, http.StatusBadRequest, CodeInvalidKey, err.Error()+" (want 1–255 printable characters)")
		return
	}
	if ct := r.Header.Get("Content-Type"); ct != "" {
		if mt, _, err := mime.ParseMediaType(ct); err != nil || mt != "application/json" {
			writeError(w, http.StatusUnsupportedMediaType, CodeUnsupportedMediaType,
				fmt.Sprintf("Content-Type %q is not application/json", ct))
			return
		}
	}
	req, code, msg := decodeRequest(w, r)
	if code != "" {
		writeError(w, http.StatusBadRequest, code, msg)
		return
	}
	res, err := s.Place(r.Context(), key, req)
	switch {
	case errors.Is(err, queue.ErrInvalid):
		writeError(w, http.StatusBadRequest, CodeInvalidBody, err.Error())
		return
	case errors.Is(err, idempotency.ErrKeyReuse):
		writeError(w, http.StatusUnprocessableEntity, CodeKeyReused,
			"this Idempotency-Key was already used with a different request; use a new key for a new order")
		return
	case errors.Is(err, idempotency.ErrKeyInFlight):
		w.Header().Set("Retry-After", "1")
		writeError(w, http.StatusConflict, CodeInFlight,
			"the first request with this Idempotency-Key is still being processed; retry with the same key")
		return
	case err != nil:
		s.log.Error("place order failed", "idempotency_key", key, "err", err)
		writeError(w, http.StatusInternalServerError, CodeInternal,
			"the order could not be placed; retrying with the same Idempotency-Key is safe")
		return
	}
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Location", "/orders/"+strconv.FormatInt(res.Order.ID, 10))
	if res.Replayed {
		h.Set(HeaderReplayed, "true")
	}
	w.WriteHeader(res.Status)
	_, _ = w.Write(res.Body)
}

// decodeRequest reads one JSON object strictly: no unknown fields, no field given
// twice, nothing after it, at most MaxBodyBytes. On failure it returns an error code and
// message.
func decodeRequest(w http.ResponseWriter, r *http.Request) (Request, string, string) {
	var req Request
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, MaxBodyBytes))
	if err == nil {
		if key, dup := duplicateKey(body); dup {
			return req, CodeInvalidBody, fmt.Sprintf("the request body gives the field %q twice "+
				"(field names match without regard to case)", key)
		}
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err == nil {
		err = dec.Decode(&req)
	}
	if err == nil {
		// Exactly one value: anything but EOF after it is an error.
		var extra json.RawMessage
		if derr := dec.Decode(&extra); derr != io.EOF {
			err = errTrailing
			if derr != nil {
				err = derr
			}
		}
	}
	var tooLarge *http.MaxBytesError
	switch {
	case err == nil:
		return req, "", ""
	case errors.As(err, &tooLarge):
		return req, CodeBodyTooLarge, fmt.Sprintf("the request body is larger than %d bytes", MaxBodyBytes)
	case errors.Is(err, io.EOF):
		return req, CodeInvalidBody, "the request body is empty; send a JSON order"
	case errors.Is(err, errTrailing):
		return req, CodeInvalidBody, "the request body must hold exactly one JSON object"
	default:
		return req, CodeInvalidBody, "malformed request body: " + err.Error()
	}
}

var errTrailing = errors.New("data after the JSON object")

// duplicateKey finds an object of the JSON text b that gives a key twice, as
// encoding/json matches keys to fields: without regard to case. Such a body is
// ambiguous (its last value wins, so reordering its keys, which JSON allows, would
// change the order and its hash). Malformed JSON is left to the decoder.
func duplicateKey(b []byte) (string, bool) {
	type frame struct {
		keys      map[string]bool // nil for an array
		expectKey bool
	}
	var stack []*frame
	valueDone := func() {
		if n := len(stack); n > 0 && stack[n-1].keys != nil {
			stack[n-1].expectKey = true
		}
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	for {
		tok, err := dec.Token()
		if err != nil {
			return "", false
		}
		switch t := tok.(type) {
		case json.Delim:
			switch t {
			case '{':
				stack = append(stack, &frame{keys: map[string]bool{}, expectKey: true})
			case '[':
				stack = append(stack, &frame{})
			default:
				stack = stack[:len(stack)-1]
				valueDone()
			}
		case string:
			if top := len(stack) - 1; top >= 0 && stack[top].keys != nil && stack[top].expectKey {
				folded := strings.Map(func(r rune) rune { return unicode.ToLower(unicode.ToUpper(r)) }, t)
				if stack[top].keys[folded] {
					return t, true
				}
				stack[top].keys[folded] = true
				stack[top].expectKey = false
				continue
			}
			valueDone()
		default:
			valueDone()
		}
	}
}

func (s *Service) handleGet(w http.ResponseWriter, r *http.Request) {
	id, err := strconv.ParseInt(r.PathValue("id"), 10, 64)
	if err != nil || id <= 0 {
		writeError(w, http.StatusBadRequest, CodeInvalidID, fmt.Sprintf("order id %q is not a positive integer", r.PathValue("id")))
		return
	}
	o, err := s.Get(r.Context(), id)
	switch {
	case errors.Is(err, queue.ErrNotFound):
		writeError(w, http.StatusNotFound, CodeNotFound, fmt.Sprintf("order %d does not exist", id))
		return
	case err != nil:
		s.log.Error("get order failed", "order_id", id, "err", err)
		writeError(w, http.StatusInternalServerError, CodeInternal, "the order could not be read")
		return
	}
	body, err := encodeOrder(o)
	if err != nil {
		s.log.Error("encode order failed", "order_id", id, "err", err)
		writeError(w, http.StatusInternalServerError, CodeInternal, "the order could not be read")
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(body)
}

func writeError(w http.ResponseWriter, status int, code, msg string) {
	body, _ := json.Marshal(ErrorBody{Error: ErrorDetail{Code: code, Message: msg}})
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(append(body, '\n'))
}
