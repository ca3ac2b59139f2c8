// Command kolo-fake-gcs serves fake-gcs-server's in-memory GCS emulator over plain HTTP on one
// address, adding the parts of the GCS XML API that object_store's GCS client uses and upstream
// fake-gcs-server lacks (fsouza/fake-gcs-server#331, #852): object PUT (with
// x-goog-if-generation-match and x-goog-copy-source) and XML multipart uploads (initiate, upload
// part, complete, abort). Every other request (JSON API, XML GET/HEAD/DELETE/list) goes to
// fake-gcs-server unchanged. Built by dev/emulators.sh; started by tests/support/emulators.py.
//
// Usage: kolo-fake-gcs -host 127.0.0.1 -port 4443
package main

import (
	"bytes"
	"crypto/md5"
	"crypto/rand"
	"encoding/hex"
	"encoding/xml"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/signal"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"

	"github.com/fsouza/fake-gcs-server/fakestorage"
)

// jsonAPIPrefixes are paths fake-gcs-server serves itself; everything else is /<bucket>/<object>.
var jsonAPIPrefixes = []string{"/storage/", "/upload/", "/download/", "/batch/", "/_internal/"}

type xmlAPI struct {
	server *fakestorage.Server
	next   http.Handler

	mu      sync.Mutex // serialises conditional writes and the upload table
	uploads map[string]*upload
}

type upload struct {
	bucket, name, contentType string
	parts                     map[int][]byte
}

func main() {
	host := flag.String("host", "127.0.0.1", "address to bind")
	port := flag.Uint("port", 4443, "port to bind")
	flag.Parse()

	addr := net.JoinHostPort(*host, strconv.FormatUint(uint64(*port), 10))
	server, err := fakestorage.NewServerWithOptions(fakestorage.Options{
		Scheme:      "http",
		Host:        *host,
		Port:        uint16(*port),
		NoListener:  true,
		PublicHost:  addr,
		ExternalURL: "http://" + addr,
		Writer:      os.Stderr,
	})
	if err != nil {
		log.Fatalf("kolo-fake-gcs: %v", err)
	}
	listener, err := net.Listen("tcp", addr)
	if err != nil {
		log.Fatalf("kolo-fake-gcs: %v", err)
	}
	api := &xmlAPI{server: server, next: server.HTTPHandler(), uploads: map[string]*upload{}}
	go func() {
		stop := make(chan os.Signal, 1)
		signal.Notify(stop, syscall.SIGINT, syscall.SIGTERM)
		<-stop
		os.Exit(0)
	}()
	fmt.Printf("READY http://%s\n", addr)
	log.Fatal(http.Serve(listener, api))
}

func (a *xmlAPI) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	for _, prefix := range jsonAPIPrefixes {
		if strings.HasPrefix(r.URL.Path, prefix) {
			a.next.ServeHTTP(w, r)
			return
		}
	}
	bucket, name, ok := strings.Cut(strings.TrimPrefix(r.URL.Path, "/"), "/")
	query := r.URL.Query()
	switch {
	case !ok || name == "":
		a.next.ServeHTTP(w, r)
	case r.Method == http.MethodPost && query.Has("uploads"):
		a.initiate(w, r, bucket, name)
	case r.Method == http.MethodPut && query.Has("uploadId"):
		a.putPart(w, r, query.Get("uploadId"), query.Get("partNumber"))
	case r.Method == http.MethodPost && query.Has("uploadId"):
		a.complete(w, r, bucket, name, query.Get("uploadId"))
	case r.Method == http.MethodDelete && query.Has("uploadId"):
		a.abort(w, query.Get("uploadId"))
	case r.Method == http.MethodPut && r.Header.Get("X-Goog-Copy-Source") != "":
		a.copyObject(w, r, bucket, name)
	case r.Method == http.MethodPut:
		body, err := io.ReadAll(r.Body)
		if err != nil {
			xmlError(w, http.StatusBadRequest, "InvalidArgument", err.Error())
			return
		}
		a.write(w, r, bucket, name, body, r.Header.Get("Content-Type"))
	default:
		a.next.ServeHTTP(w, r)
	}
}

// write stores an object if x-goog-if-generation-match allows it and answers like GCS's XML API.
func (a *xmlAPI) write(w http.ResponseWriter, r *http.Request, bucket, name string, body []byte, contentType string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if match := r.Header.Get("X-Goog-If-Generation-Match"); match != "" {
		current, err := a.server.GetObject(bucket, name)
		generation := int64(0)
		if err == nil {
			generation = current.Generation
		}
		if strconv.FormatInt(generation, 10) != match {
			xmlError(w, http.StatusPreconditionFailed, "PreconditionFailed",
				"At least one of the pre-conditions you specified did not hold.")
			return
		}
	}
	if contentType == "" {
		contentType = "application/octet-stream"
	}
	metadata := map[string]string{}
	for key, values := range r.Header {
		if lower := strings.ToLower(key); strings.HasPrefix(lower, "x-goog-meta-") && len(values) > 0 {
			metadata[strings.TrimPrefix(lower, "x-goog-meta-")] = values[0]
		}
	}
	err := a.server.CreateObjectStreaming(fakestorage.Object{
		ObjectAttrs: fakestorage.ObjectAttrs{
			BucketName:         bucket,
			Name:               name,
			ContentType:        contentType,
			ContentEncoding:    r.Header.Get("Content-Encoding"),
			ContentDisposition: r.Header.Get("Content-Disposition"),
			ContentLanguage:    r.Header.Get("Content-Language"),
			CacheControl:       r.Header.Get("Cache-Control"),
			Metadata:           metadata,
		},
		Content: body,
	}.StreamingObject())
	if err != nil {
		xmlError(w, http.StatusInternalServerError, "InternalError", err.Error())
		return
	}
	stored, err := a.server.GetObject(bucket, name)
	if err != nil {
		xmlError(w, http.StatusInternalServerError, "InternalError", err.Error())
		return
	}
	w.Header().Set("ETag", strconv.Quote(stored.Etag))
	w.Header().Set("X-Goog-Generation", strconv.FormatInt(stored.Generation, 10))
	w.WriteHeader(http.StatusOK)
}

func (a *xmlAPI) copyObject(w http.ResponseWriter, r *http.Request, bucket, name string) {
	source, err := url.PathUnescape(strings.TrimPrefix(r.Header.Get("X-Goog-Copy-Source"), "/"))
	if err != nil {
		xmlError(w, http.StatusBadRequest, "InvalidArgument", err.Error())
		return
	}
	sourceBucket, sourceName, _ := strings.Cut(source, "/")
	object, err := a.server.GetObject(sourceBucket, sourceName)
	if err != nil {
		xmlError(w, http.StatusNotFound, "NoSuchKey", "The specified key does not exist.")
		return
	}
	a.write(w, r, bucket, name, object.Content, object.ContentType)
}

func (a *xmlAPI) initiate(w http.ResponseWriter, r *http.Request, bucket, name string) {
	id := make([]byte, 16)
	if _, err := rand.Read(id); err != nil {
		xmlError(w, http.StatusInternalServerError, "InternalError", err.Error())
		return
	}
	uploadID := hex.EncodeToString(id)
	a.mu.Lock()
	a.uploads[uploadID] = &upload{bucket: bucket, name: name, contentType: r.Header.Get("Content-Type"), parts: map[int][]byte{}}
	a.mu.Unlock()
	writeXML(w, http.StatusOK, struct {
		XMLName  xml.Name `xml:"InitiateMultipartUploadResult"`
		Bucket   string   `xml:"Bucket"`
		Key      string   `xml:"Key"`
		UploadID string   `xml:"UploadId"`
	}{Bucket: bucket, Key: name, UploadID: uploadID})
}

func (a *xmlAPI) putPart(w http.ResponseWriter, r *http.Request, uploadID, partNumber string) {
	number, err := strconv.Atoi(partNumber)
	if err != nil || number < 1 {
		xmlError(w, http.StatusBadRequest, "InvalidArgument", "partNumber must be a positive integer")
		return
	}
	body, err := io.ReadAll(r.Body)
	if err != nil {
		xmlError(w, http.StatusBadRequest, "InvalidArgument", err.Error())
		return
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	up, ok := a.uploads[uploadID]
	if !ok {
		xmlError(w, http.StatusNotFound, "NoSuchUpload", "The specified multipart upload does not exist.")
		return
	}
	up.parts[number] = body
	sum := md5.Sum(body)
	w.Header().Set("ETag", strconv.Quote(hex.EncodeToString(sum[:])))
	w.WriteHeader(http.StatusOK)
}

func (a *xmlAPI) complete(w http.ResponseWriter, r *http.Request, bucket, name, uploadID string) {
	var request struct {
		Parts []struct {
			PartNumber int    `xml:"PartNumber"`
			ETag       string `xml:"ETag"`
		} `xml:"Part"`
	}
	if err := xml.NewDecoder(r.Body).Decode(&request); err != nil && !errors.Is(err, io.EOF) {
		xmlError(w, http.StatusBadRequest, "MalformedXML", err.Error())
		return
	}
	a.mu.Lock()
	up, ok := a.uploads[uploadID]
	if ok {
		delete(a.uploads, uploadID)
	}
	a.mu.Unlock()
	if !ok || up.bucket != bucket || up.name != name {
		xmlError(w, http.StatusNotFound, "NoSuchUpload", "The specified multipart upload does not exist.")
		return
	}
	sort.SliceStable(request.Parts, func(i, j int) bool { return request.Parts[i].PartNumber < request.Parts[j].PartNumber })
	var content bytes.Buffer
	for _, part := range request.Parts {
		data, ok := up.parts[part.PartNumber]
		if !ok {
			xmlError(w, http.StatusBadRequest, "InvalidPart", fmt.Sprintf("part %d was not uploaded", part.PartNumber))
			return
		}
		content.Write(data)
	}
	recorder := &headerRecorder{header: http.Header{}}
	a.write(recorder, r, bucket, name, content.Bytes(), up.contentType)
	for key, values := range recorder.header {
		w.Header()[key] = values
	}
	if recorder.status != http.StatusOK {
		w.WriteHeader(recorder.status)
		_, _ = w.Write(recorder.body.Bytes())
		return
	}
	writeXML(w, http.StatusOK, struct {
		XMLName xml.Name `xml:"CompleteMultipartUploadResult"`
		Bucket  string   `xml:"Bucket"`
		Key     string   `xml:"Key"`
		ETag    string   `xml:"ETag"`
	}{Bucket: bucket, Key: name, ETag: recorder.header.Get("ETag")})
}

func (a *xmlAPI) abort(w http.ResponseWriter, uploadID string) {
	a.mu.Lock()
	delete(a.uploads, uploadID)
	a.mu.Unlock()
	w.WriteHeader(http.StatusNoContent)
}

// headerRecorder captures a response so complete() can wrap write()'s answer in XML.
type headerRecorder struct {
	header http.Header
	status int
	body   bytes.Buffer
}

func (h *headerRecorder) Header() http.Header         { return h.header }
func (h *headerRecorder) Write(b []byte) (int, error) { return h.body.Write(b) }
func (h *headerRecorder) WriteHeader(status int)      { h.status = status }

func writeXML(w http.ResponseWriter, status int, value any) {
	raw, err := xml.Marshal(value)
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/xml")
	w.WriteHeader(status)
	_, _ = w.Write(append([]byte(xml.Header), raw...))
}

func xmlError(w http.ResponseWriter, status int, code, message string) {
	writeXML(w, status, struct {
		XMLName xml.Name `xml:"Error"`
		Code    string   `xml:"Code"`
		Message string   `xml:"Message"`
	}{Code: code, Message: message})
}
