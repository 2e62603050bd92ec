// Package v1beta1 declares the parts of the OpenFeature Operator's FeatureFlag API type
// that flagd's Kubernetes sync source uses: the group/version, scheme registration, and a
// FeatureFlag whose spec.flagSpec is kept as arbitrary JSON.
package v1beta1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// GroupVersion is the API group and version of FeatureFlag objects.
var GroupVersion = schema.GroupVersion{Group: "core.openfeature.dev", Version: "v1beta1"}

// SchemeBuilder registers the types of this package.
var SchemeBuilder = runtime.NewSchemeBuilder(func(scheme *runtime.Scheme) error {
	scheme.AddKnownTypes(GroupVersion, &FeatureFlag{}, &FeatureFlagList{})
	metav1.AddToGroupVersion(scheme, GroupVersion)
	return nil
})

// AddToScheme adds the types of this package to a scheme.
var AddToScheme = SchemeBuilder.AddToScheme

// FeatureFlag is a set of flags for flagd.
type FeatureFlag struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec FeatureFlagSpec `json:"spec,omitempty"`
}

// FeatureFlagSpec holds the flag configuration.
type FeatureFlagSpec struct {
	// FlagSpec is the flag configuration document (flags, $evaluators, metadata).
	FlagSpec map[string]interface{} `json:"flagSpec,omitempty"`
}

// FeatureFlagList is a list of FeatureFlag objects.
type FeatureFlagList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`

	Items []FeatureFlag `json:"items"`
}

// DeepCopyInto copies the receiver into out.
func (in *FeatureFlag) DeepCopyInto(out *FeatureFlag) {
	*out = *in
	out.TypeMeta = in.TypeMeta
	in.ObjectMeta.DeepCopyInto(&out.ObjectMeta)
	if in.Spec.FlagSpec != nil {
		out.Spec.FlagSpec = runtime.DeepCopyJSON(in.Spec.FlagSpec)
	}
}

// DeepCopy returns a copy of the receiver.
func (in *FeatureFlag) DeepCopy() *FeatureFlag {
	if in == nil {
		return nil
	}
	out := new(FeatureFlag)
	in.DeepCopyInto(out)
	return out
}

// DeepCopyObject implements runtime.Object.
func (in *FeatureFlag) DeepCopyObject() runtime.Object {
	return in.DeepCopy()
}

// DeepCopyObject implements runtime.Object.
func (in *FeatureFlagList) DeepCopyObject() runtime.Object {
	if in == nil {
		return nil
	}
	out := &FeatureFlagList{TypeMeta: in.TypeMeta}
	in.ListMeta.DeepCopyInto(&out.ListMeta)
	if in.Items != nil {
		out.Items = make([]FeatureFlag, len(in.Items))
		for i := range in.Items {
			in.Items[i].DeepCopyInto(&out.Items[i])
		}
	}
	return out
}
